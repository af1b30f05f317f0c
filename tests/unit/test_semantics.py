"""Unit tests for vkprovider.semantics: the one reading of Kubernetes rules that the provider and
the companion share (quantities, selectors, taints, GPU counts, times), and the callers that must
agree with it (translation, budgets, move-back's fit check)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from vkprovider.descheduler.fit import node_problem, requests_of, slim_node
from vkprovider.node.translate import translate
from vkprovider.placement import budget
from vkprovider.semantics.gpus import container_gpus, pod_gpus, pod_spec_gpus
from vkprovider.semantics.quantity import (
    QuantityError,
    cpu_millis,
    memory_bytes,
    parse_count,
    parse_quantity,
    whole_count,
)
from vkprovider.semantics.selectors import (
    SelectorError,
    label_selector_matches,
    node_selector_matches,
    node_selector_term_matches,
)
from vkprovider.semantics.taints import tolerated, tolerates, untolerated_taint
from vkprovider.semantics.timefmt import (
    TimeFormatError,
    format_micro_time,
    format_time,
    parse_time,
)

GPU = "nvidia.com/gpu"


# --------------------------------------------------------------------------------------------
# Quantities


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Decimal(1)),
        ("0", Decimal(0)),
        ("+2", Decimal(2)),
        ("-1", Decimal(-1)),
        ("100m", Decimal("0.1")),
        ("1500m", Decimal("1.5")),
        ("0.5", Decimal("0.5")),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("250n", Decimal("0.00000025")),
        ("3u", Decimal("0.000003")),
        ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)),
        ("2G", Decimal(2 * 10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("1Ki", Decimal(1024)),
        ("1Mi", Decimal(2**20)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("64Ti", Decimal(64 * 2**40)),
        ("1Pi", Decimal(2**50)),
        ("1Ei", Decimal(2**60)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("12e-3", Decimal("0.012")),
        ("2e+2", Decimal(200)),
        (" 4 ", Decimal(4)),
        (8, Decimal(8)),
        (0.25, Decimal("0.25")),
    ],
)
def test_parse_quantity(text: object, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "1.2.3",
        "1e",  # "e" alone is not a suffix
        "Ki",
        "1KiB",
        "1ki",
        "--1",
        "1 Gi",
        "1K",  # kilo is lower-case k
        "0x10",
        "1e999",  # exponent out of range
        "1" * 100,  # absurdly long
        None,
        True,
        [1],
        float("nan"),
        float("inf"),
    ],
)
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_quantity_error_is_a_value_error_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity("12 cores")


@pytest.mark.parametrize(
    ("text", "millis"),
    [("1", 1000), ("100m", 100), ("0.5", 500), ("1u", 1), ("1500u", 2), ("2e3", 2_000_000)],
)
def test_cpu_millis_rounds_up(text: str, millis: int) -> None:
    assert cpu_millis(parse_quantity(text)) == millis


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("1Gi", 2**30), ("1G", 10**9), ("500m", 1), ("1.5Ki", 1536), ("129e6", 129_000_000)],
)
def test_memory_bytes_rounds_up(text: str, nbytes: int) -> None:
    assert memory_bytes(parse_quantity(text)) == nbytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100M", Decimal(10**8)),
        ("2e3", Decimal(2000)),
        ("500m", Decimal("0.5")),
        ("1000m", Decimal(1)),
        ("1e0", Decimal(1)),
        ("-1.5Gi", Decimal(-3 * 2**29)),
        # More digits than Decimal's default 28: parsed exactly, not rounded.
        ("123456789012345678901234567890123", Decimal("123456789012345678901234567890123")),
        ("1234567890123456789012345678901.5Ki",
         Decimal(1234567890123456789012345678901 * 1024 + 512)),
        ("-123456789012345678901234567890123e-3", Decimal("-123456789012345678901234567890.123")),
    ],
)
def test_parse_quantity_more_forms_and_exactness(text: str, expected: Decimal) -> None:
    got = parse_quantity(text)
    assert got == expected
    assert isinstance(got, Decimal)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("12 cores", "'12 cores' is not a quantity"),
        ("", "empty quantity"),
        ("1e999", "exponent 999 is out of range"),
        ("1" * 100, "longer than 64 characters"),
        (None, "expected a string quantity, got NoneType"),
        (True, "True is not a quantity"),
        (float("inf"), "inf is not a finite quantity"),
    ],
)
def test_parse_quantity_errors_say_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(value)
    assert message in str(info.value)


def test_cpu_millis_is_exact_for_long_quantities() -> None:
    # 30 significant digits of cores: the default Decimal context would round the product.
    assert cpu_millis(parse_quantity("123456789012345678901234567.891")) == (
        123456789012345678901234567891
    )


# --------------------------------------------------------------------------------------------
# Counts of extended resources


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("1", 1),
        ("1000m", 1),
        ("1e0", 1),
        ("2000m", 2),
        ("8", 8),
        ("2.0", 2),
        ("0", 0),
        ("1k", 1000),
        ("2e3", 2000),
        (4, 4),
        (" 3 ", 3),
    ],
)
def test_parse_count_accepts_whole_numbers_in_any_notation(value: object, count: int) -> None:
    assert parse_count(value) == count


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.5", "'1.5' is not a whole number"),
        ("500m", "'500m' is not a whole number"),
        ("0.5", "'0.5' is not a whole number"),
        ("1e-1", "'1e-1' is not a whole number"),
        ("1001m", "'1001m' is not a whole number"),
        ("-1", "'-1' is negative"),
        ("-2e0", "'-2e0' is negative"),
        ("x", "'x' is not a quantity"),
    ],
)
def test_parse_count_rejects_fractions_and_negatives_naming_the_value(
    value: str, message: str
) -> None:
    with pytest.raises(QuantityError) as info:
        parse_count(value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("quantity", "outcome"),
    [(Decimal("3"), 3), (Decimal("3.000"), 3), (Decimal("2.5"), "'2.5' is not a whole number"),
     (Decimal("-4"), "'-4' is negative"), (Decimal("NaN"), "is not a whole number")],
)
def test_whole_count_of_a_parsed_quantity(quantity: Decimal, outcome: int | str) -> None:
    if isinstance(outcome, int):
        assert whole_count(quantity) == outcome
    else:
        with pytest.raises(QuantityError) as info:
            whole_count(quantity)
        assert outcome in str(info.value)


# --------------------------------------------------------------------------------------------
# Label selectors

LABELS = {"app": "infer", "tier": "gold", "team": "", "gen": "3"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({}, True),
        ({"matchLabels": {}, "matchExpressions": []}, True),
        ({"matchLabels": {"app": "infer"}}, True),
        ({"matchLabels": {"app": "infer", "tier": "gold"}}, True),
        ({"matchLabels": {"app": "train"}}, False),
        ({"matchLabels": {"missing": ""}}, False),  # "" is a value, the key must exist
        ({"matchLabels": {"team": ""}}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "x"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["silver"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["silver"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "team", "operator": "DoesNotExist", "values": []}]},
         False),
        ({"matchLabels": {"app": "infer"},
          "matchExpressions": [{"key": "team", "operator": "Exists"},
                               {"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, False),
        ({"matchLabels": {"app": "infer"},
          "matchExpressions": [{"key": "team", "operator": "Exists"},
                               {"key": "tier", "operator": "In", "values": ["gold"]}]}, True),
    ],
)
def test_label_selector_matches(selector: dict[str, Any], expected: bool) -> None:
    assert label_selector_matches(selector, labels=LABELS) is expected


@pytest.mark.parametrize(
    ("selector", "field"),
    [
        ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["1"]}]},
         "matchExpressions[0].operator"),  # Gt/Lt are for node selectors only
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
         "matchExpressions[0].values"),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn"}]},
         "matchExpressions[0].values"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"},
                               {"key": "b", "operator": "DoesNotExist", "values": ["x"]}]},
         "matchExpressions[1].values"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0].key"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]},
         "matchExpressions[0].values"),
        ({"matchLabels": {"a": 1}}, "matchLabels.a"),
        ({"matchLabels": ["a"]}, "matchLabels"),
    ],
)
def test_malformed_label_selectors_are_errors_naming_the_field(
    selector: dict[str, Any], field: str
) -> None:
    with pytest.raises(SelectorError) as info:
        label_selector_matches(selector, labels=LABELS)
    assert info.value.field == field


# --------------------------------------------------------------------------------------------
# Node selector terms (required node affinity), as the scheduler reads them

NODE_LABELS = {"gpu": "a100", "gpus": "8", "zone": "eu-1", "rev": "007", "big": "9" * 30}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ({"matchExpressions": [expr("gpu", "In", "a100", "h100")]}, True),
        ({"matchExpressions": [expr("gpu", "In", "h100")]}, False),
        ({"matchExpressions": [expr("gpu", "NotIn", "h100")]}, True),
        ({"matchExpressions": [expr("gpu", "NotIn", "a100")]}, False),
        ({"matchExpressions": [expr("absent", "NotIn", "x")]}, True),
        ({"matchExpressions": [expr("zone", "Exists")]}, True),
        ({"matchExpressions": [expr("absent", "Exists")]}, False),
        ({"matchExpressions": [expr("absent", "DoesNotExist")]}, True),
        ({"matchExpressions": [expr("zone", "DoesNotExist")]}, False),
        ({"matchExpressions": [expr("gpus", "Gt", "4")]}, True),
        ({"matchExpressions": [expr("gpus", "Gt", "8")]}, False),
        ({"matchExpressions": [expr("gpus", "Lt", "9")]}, True),
        ({"matchExpressions": [expr("gpus", "Lt", "8")]}, False),
        ({"matchExpressions": [expr("rev", "Gt", "6")]}, True),  # "007" parses as 7
        ({"matchExpressions": [expr("absent", "Gt", "0")]}, False),
        ({"matchExpressions": [expr("gpu", "Gt", "0")]}, False),  # label is not an integer
        ({"matchExpressions": [expr("big", "Gt", "0")]}, False),  # label overflows int64
        # A malformed requirement makes the whole term select nothing.
        ({"matchExpressions": [expr("gpus", "Gt", "1.5")]}, False),
        ({"matchExpressions": [expr("gpus", "Gt", "-1")]}, False),
        ({"matchExpressions": [expr("gpus", "Gt", "1e0")]}, False),
        ({"matchExpressions": [expr("gpus", "Lt", "10", "20")]}, False),
        ({"matchExpressions": [expr("gpus", "Gt")]}, False),
        ({"matchExpressions": [expr("gpu", "In")]}, False),
        ({"matchExpressions": [expr("gpu", "NotIn")]}, False),
        ({"matchExpressions": [expr("zone", "Exists", "eu-1")]}, False),
        ({"matchExpressions": [expr("zone", "Near", "eu-1")]}, False),
        ({"matchExpressions": [expr("zone", "Exists"), expr("gpus", "Gt", "x")]}, False),
        # Requirements of a term are ANDed.
        ({"matchExpressions": [expr("gpu", "In", "a100"), expr("zone", "In", "eu-1")]}, True),
        ({"matchExpressions": [expr("gpu", "In", "a100"), expr("zone", "In", "us-1")]}, False),
        # An empty term selects no node.
        ({}, False),
        ({"matchExpressions": [], "matchFields": []}, False),
        # matchFields: metadata.name, In/NotIn with exactly one value.
        ({"matchFields": [expr("metadata.name", "In", "gpu-1")]}, True),
        ({"matchFields": [expr("metadata.name", "In", "gpu-2")]}, False),
        ({"matchFields": [expr("metadata.name", "NotIn", "gpu-2")]}, True),
        ({"matchFields": [expr("metadata.name", "NotIn", "gpu-1")]}, False),
        ({"matchFields": [expr("metadata.name", "In", "gpu-1", "gpu-2")]}, False),
        ({"matchFields": [expr("metadata.name", "Exists")]}, False),
        ({"matchExpressions": [expr("gpu", "In", "a100")],
          "matchFields": [expr("metadata.name", "In", "gpu-2")]}, False),
        ({"matchExpressions": [expr("gpu", "In", "a100")],
          "matchFields": [expr("metadata.name", "In", "gpu-1")]}, True),
    ],
)
def test_node_selector_term_matches(term: dict[str, Any], expected: bool) -> None:
    got = node_selector_term_matches(term, labels=NODE_LABELS,
                                     fields={"metadata.name": "gpu-1"})
    assert got is expected


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        ([], False),
        ([{"matchExpressions": [expr("gpu", "In", "h100")]}], False),
        ([{"matchExpressions": [expr("gpu", "In", "h100")]},
          {"matchExpressions": [expr("gpu", "In", "a100")]}], True),  # terms are ORed
        ([{}, {"matchExpressions": [expr("zone", "Exists")]}], True),
        ([{}], False),
        ([{"matchExpressions": [expr("gpus", "Gt", "bad")]},
          {"matchExpressions": [expr("gpus", "Gt", "7")]}], True),  # a bad term is skipped
    ],
)
def test_node_selector_ors_its_terms(terms: list[dict[str, Any]], expected: bool) -> None:
    got = node_selector_matches({"nodeSelectorTerms": terms}, labels=NODE_LABELS)
    assert got is expected


# --------------------------------------------------------------------------------------------
# Taints and tolerations

TAINT = {"key": "virtual-kubelet.io/provider", "value": "vkprovider", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        # An empty key with Exists tolerates every taint, whatever its key, value and effect.
        ({"operator": "Exists"}, TAINT, True),
        ({"operator": "Exists"}, {"key": "x", "effect": "NoExecute"}, True),
        ({"key": "", "operator": "Exists", "effect": ""}, {"key": "y", "value": "z",
                                                            "effect": "PreferNoSchedule"}, True),
        # ... unless it names an effect.
        ({"operator": "Exists", "effect": "NoExecute"}, TAINT, False),
        ({"operator": "Exists", "effect": "NoSchedule"}, TAINT, True),
        # Exists with a key: any value of that key.
        ({"key": TAINT["key"], "operator": "Exists"}, TAINT, True),
        ({"key": "other", "operator": "Exists"}, TAINT, False),
        # Equal: key and value must both match.
        ({"key": TAINT["key"], "operator": "Equal", "value": "vkprovider"}, TAINT, True),
        ({"key": TAINT["key"], "operator": "Equal", "value": "other"}, TAINT, False),
        ({"key": "other", "operator": "Equal", "value": "vkprovider"}, TAINT, False),
        # No operator means Equal.
        ({"key": TAINT["key"], "value": "vkprovider"}, TAINT, True),
        ({"key": TAINT["key"], "value": "other"}, TAINT, False),
        ({"key": TAINT["key"]}, TAINT, False),  # absent value is "", not a wildcard
        ({"key": "k", "operator": "Equal"}, {"key": "k", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": ""}, {"key": "k", "value": "", "effect": "NoSchedule"}, True),
        # An empty effect matches every effect; a set one only its own.
        ({"key": TAINT["key"], "operator": "Exists", "effect": ""}, TAINT, True),
        ({"key": "k", "operator": "Exists"}, {"key": "k", "effect": "NoExecute"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"},
         {"key": "k", "effect": "NoExecute"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"},
         {"key": "k", "effect": "NoExecute"}, False),
        ({"key": "k", "operator": "Exists", "effect": "PreferNoSchedule"},
         {"key": "k", "effect": "NoSchedule"}, False),
        # An operator Kubernetes does not know tolerates nothing.
        ({"key": TAINT["key"], "operator": "Matches", "value": "vkprovider"}, TAINT, False),
        ({"key": TAINT["key"], "operator": "exists"}, TAINT, False),  # case-sensitive
    ],
)
def test_toleration_tolerates_taint(
    toleration: dict[str, str], taint: dict[str, str], expected: bool
) -> None:
    assert tolerates(toleration, taint=taint) is expected


def test_tolerated_needs_any_one_toleration() -> None:
    nope = {"key": "other", "operator": "Exists"}
    yes = {"key": TAINT["key"], "operator": "Exists"}
    assert tolerated(TAINT, tolerations=[nope]) is False
    assert tolerated(TAINT, tolerations=[nope, yes]) is True
    assert tolerated(TAINT, tolerations=[]) is False


@pytest.mark.parametrize(
    ("taints", "tolerations", "first"),
    [
        ([], [], None),
        ([{"key": "a", "effect": "PreferNoSchedule"}], [], None),  # only scores, never filters
        ([{"key": "a", "effect": "NoSchedule"}], [], "a"),
        ([{"key": "a", "effect": "NoExecute"}], [], "a"),
        ([{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}],
         [{"key": "a", "operator": "Exists"}], "b"),
        ([{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}],
         [{"operator": "Exists"}], None),
    ],
)
def test_untolerated_taint_is_the_schedulers_filter(
    taints: list[dict[str, str]], tolerations: list[dict[str, str]], first: str | None
) -> None:
    found = untolerated_taint(taints, tolerations=tolerations)
    assert (found["key"] if found is not None else None) == first


# --------------------------------------------------------------------------------------------
# GPU counts


def container(limits: dict[str, Any] | None = None,
              requests: dict[str, Any] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "image": "img", "resources": resources}


@pytest.mark.parametrize(
    ("c", "gpus"),
    [
        (container(limits={GPU: "1"}), 1),
        (container(limits={GPU: "1000m"}), 1),
        (container(limits={GPU: "1e0"}), 1),
        (container(limits={GPU: "4"}, requests={GPU: "4"}), 4),
        (container(requests={GPU: "2"}), 2),  # no limit written: the request
        (container(limits={GPU: "3"}, requests={GPU: "1"}), 3),  # the limit is the count
        (container(limits={"cpu": "4"}), 0),
        (container(), 0),
        ({"name": "bare"}, 0),
    ],
)
def test_container_gpus_reads_the_limit_then_the_request(c: dict[str, Any], gpus: int) -> None:
    assert container_gpus(c) == gpus


def test_container_gpus_counts_another_extended_resource_when_asked() -> None:
    c = container(limits={GPU: "1", "amd.com/gpu": "2000m"})
    assert container_gpus(c, resource="amd.com/gpu") == 2


@pytest.mark.parametrize("bad", ["1.5", "500m", "-1", "x"])
def test_container_gpus_refuses_what_is_not_a_whole_count(bad: str) -> None:
    with pytest.raises(QuantityError) as info:
        container_gpus(container(limits={GPU: bad}))
    assert repr(bad) in str(info.value)


def test_pod_gpus_sums_containers_and_can_skip_invalid_ones() -> None:
    pod = {"spec": {"containers": [container(limits={GPU: "1000m"}),
                                   container(requests={GPU: "2"}),
                                   container(limits={GPU: "0.5"})]}}
    with pytest.raises(QuantityError, match=r"'0\.5'"):
        pod_gpus(pod)
    assert pod_gpus(pod, skip_invalid=True) == 3
    assert pod_spec_gpus(pod["spec"], skip_invalid=True) == 3
    assert pod_gpus({"spec": {}}) == 0
    assert pod_gpus({}) == 0


# --------------------------------------------------------------------------------------------
# The callers agree: budget, translation and move-back count a pod's GPUs the same way


class NoRefs:
    async def secret(self, *, namespace: str, name: str) -> dict[str, str] | None:
        return None

    async def config_map(self, *, namespace: str, name: str) -> dict[str, str] | None:
        return None


def gpu_pod(amount: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                     "annotations": {budget.POLICY_ANNOTATION: "burst"}},
        "status": {"phase": "Running"},
        "spec": {"containers": [container(limits={GPU: amount})]},
    }


@pytest.mark.parametrize(("amount", "gpus"), [("1", 1), ("1000m", 1), ("1e0", 1),
                                              ("2000m", 2), ("8e0", 8), ("3", 3)])
async def test_budget_translation_and_fit_count_the_same_gpus(amount: str, gpus: int) -> None:
    pod = gpu_pod(amount)
    # The regression: budget.pod_gpus read "1000m" and "1e0" as 0 GPUs, translation as 1.
    assert budget.pod_gpus(pod) == gpus
    assert budget.usage_by_policy([pod])["burst"].gpus == gpus
    spec = await translate(pod=pod, node_name="vk", refs=NoRefs())
    assert spec.gpu_count == gpus
    assert requests_of(pod["spec"])[GPU] == gpus


@pytest.mark.parametrize("bad", ["0.5", "1.5", "x"])
def test_budget_counts_an_invalid_gpu_amount_as_none(bad: str) -> None:
    pod = gpu_pod(bad)
    pod["spec"]["containers"].append(container(limits={GPU: "2"}))
    assert budget.pod_gpus(pod) == 2
    assert requests_of(pod["spec"])[GPU] == 2


def ready_node(*, labels: dict[str, str], taints: list[dict[str, str]] | None = None
               ) -> dict[str, Any]:
    return slim_node({
        "metadata": {"name": "gpu-1", "labels": labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", GPU: "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


@pytest.mark.parametrize(
    ("pod_spec", "problem"),
    [
        ({}, None),
        ({"affinity": affinity({"matchExpressions": [expr("gpus", "Gt", "4")]})}, None),
        ({"affinity": affinity({"matchExpressions": [expr("gpus", "Gt", "8")]})},
         "does not match required node affinity"),
        ({"affinity": affinity({"matchFields": [expr("metadata.name", "In", "gpu-1")]})}, None),
        ({"affinity": affinity({"matchFields": [expr("metadata.name", "In", "gpu-9")]})},
         "does not match required node affinity"),
        ({"affinity": affinity({})}, "does not match required node affinity"),
        ({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}]}, None),
        ({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web"}]},
         "has taint dedicated=ml:NoSchedule"),
    ],
)
def test_fit_applies_the_schedulers_rules(pod_spec: dict[str, Any], problem: str | None) -> None:
    node = ready_node(labels={"gpus": "8"},
                      taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
    if "tolerations" not in pod_spec:
        pod_spec = {**pod_spec, "tolerations": [{"operator": "Exists"}]}
    got = node_problem(pod_spec=pod_spec, node=node, used={}, need=requests_of(pod_spec))
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


# --------------------------------------------------------------------------------------------
# Times

PLUS2 = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("moment", "seconds", "micros"),
    [
        (datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC),
         "2026-01-01T12:00:00Z", "2026-01-01T12:00:00.000000Z"),
        (datetime(2026, 1, 1, 12, 0, 0, 123, tzinfo=UTC),
         "2026-01-01T12:00:00Z", "2026-01-01T12:00:00.000123Z"),
        (datetime(2026, 1, 1, 12, 0, 0, 999_999, tzinfo=UTC),
         "2026-01-01T12:00:00Z", "2026-01-01T12:00:00.999999Z"),  # truncated, not rounded
        (datetime(2026, 1, 1, 14, 30, 5, tzinfo=PLUS2),
         "2026-01-01T12:30:05Z", "2026-01-01T12:30:05.000000Z"),  # converted to UTC
        (datetime(2026, 1, 1, 1, 0, 0, tzinfo=PLUS2),
         "2025-12-31T23:00:00Z", "2025-12-31T23:00:00.000000Z"),
        (datetime(2026, 1, 1, 12, 0, 0),  # naive: UTC, never local time
         "2026-01-01T12:00:00Z", "2026-01-01T12:00:00.000000Z"),
    ],
)
def test_format_time_and_micro_time(moment: datetime, seconds: str, micros: str) -> None:
    assert format_time(moment) == seconds
    assert format_micro_time(moment) == micros


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:10Z", datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)),
        ("2026-01-01T00:00:10.000123Z", datetime(2026, 1, 1, 0, 0, 10, 123, tzinfo=UTC)),
        ("2026-01-01T00:00:10.5Z", datetime(2026, 1, 1, 0, 0, 10, 500_000, tzinfo=UTC)),
        ("2026-01-01T02:00:10+02:00", datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)),
        ("2026-01-01T00:00:10", datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)),  # no offset: UTC
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    got = parse_time(text)
    assert got == expected
    assert got.tzinfo is not None


def test_parse_time_reads_what_format_time_writes() -> None:
    moment = datetime(2026, 3, 4, 5, 6, 7, 891_011, tzinfo=UTC)
    assert parse_time(format_micro_time(moment)) == moment
    assert parse_time(format_time(moment)) == moment.replace(microsecond=0)
    assert parse_time("2026-01-01T00:00:10Z").timestamp() == 1767225610.0


@pytest.mark.parametrize("bad", ["", "yesterday", "2026-13-01T00:00:00Z", "2026-01-01T25:00Z"])
def test_parse_time_rejects_naming_the_text(bad: str) -> None:
    with pytest.raises(TimeFormatError) as info:
        parse_time(bad)
    assert repr(bad) in str(info.value)
