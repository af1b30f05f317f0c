"""Unit tests for vkprovider.node.fidelity: the table of what each cloud does with each pod field.

The table is complete for the four cloud types, its refusals are the ones translate makes (each
one exercised by a translate refusal test or an e2e bad pod), a pod that sets WARNED fields gets
one warning per field (and the plain pod none), and docs/pod-spec.md is the table rendered.
Schema coverage (every PodSpec/Container property has an entry) is checked against the real API
server in tests/e2e/test_fidelity_schema.py.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from test_translate import PROBE_CASES, REJECTIONS, FakeRefs, c0, make_pod

from providers.base import InvalidSpec
from vkprovider.errors import PodConfigPending, PodRejected
from vkprovider.node import fidelity, fidelitydoc, fieldcheck, fieldpaths
from vkprovider.node.fidelity import CLOUD_TYPES, ENTRIES, Decision, Entry
from vkprovider.node.translate import FieldsDropped, fields_dropped, translate, validate
from vkprovider.registry import build_adapter

ROOT = Path(__file__).resolve().parents[2]
NODE = "vk-gpu-burst"

#: WARNED entries that never warn: their only "dropped" value is every pod's default.
NEVER_WARNED = {"spec.enableServiceLinks"}


def translation_refusals() -> list[Entry]:
    return [e for e in ENTRIES if e.refused_by_translation]


def _build(cloud: str) -> Any:
    options: dict[str, Any] = {"max_attempts": 1}
    if cloud == "salad":
        options.update(organization="org", project="proj")
    # No test here reaches the network: nothing listens on port 9.
    return build_adapter(type_=cloud, name=f"{cloud}-1", url="http://127.0.0.1:9",
                         api_key="k", timeout=1.0, options=options, owner=NODE, field="test")


@pytest_asyncio.fixture
async def adapter() -> AsyncIterator[Callable[[str], Any]]:
    """Build real adapters of each cloud type (closed after the test)."""
    built: list[Any] = []

    def make(cloud: str) -> Any:
        built.append(_build(cloud))
        return built[-1]

    yield make
    for provider in built:
        await provider.aclose()


# --------------------------------------------------------------------------------------------
# The table itself


def test_every_entry_decides_for_each_cloud_type() -> None:
    assert set(CLOUD_TYPES) == {"mock", "runpod", "vastai", "salad"}
    for entry in ENTRIES:
        assert set(entry.rules) == set(CLOUD_TYPES), entry.path
        for rule in entry.rules.values():
            assert isinstance(rule.decision, Decision) and rule.text, entry.path


def test_the_table_is_not_trivial() -> None:
    paths = {e.path for e in ENTRIES}
    assert len(ENTRIES) >= 100
    # the fields the issue names as silently dropped all have an entry
    for path in ("spec.imagePullSecrets", "spec.restartPolicy", "spec.containers[0].workingDir",
                 "spec.containers[0].securityContext.runAsUser", "spec.containers[0].lifecycle",
                 "spec.containers[0].terminationMessagePath", "spec.activeDeadlineSeconds",
                 "spec.containers[0].resources.{limits,requests}[*]"):
        assert path in paths


def test_a_translation_refusal_is_the_same_on_every_cloud_and_has_a_reason() -> None:
    for entry in translation_refusals():
        assert {r.decision for r in entry.rules.values()} == {Decision.REFUSED}, entry.path
        assert len({r.text for r in entry.rules.values()}) == 1, entry.path
        assert entry.reason in ("UnsupportedPodSpec", "InvalidImageName", "InvalidResources")
        assert entry.when


def test_scheduling_fields_are_honoured_as_used_by_the_scheduler() -> None:
    by_path = {e.path: e for e in ENTRIES}
    for name in ("affinity", "tolerations", "topologySpreadConstraints", "schedulerName",
                 "priority", "priorityClassName", "preemptionPolicy", "schedulingGates",
                 "nodeSelector"):
        entry = by_path[f"spec.{name}"]
        assert entry.decisions == {Decision.HONOURED}
        assert entry.rule("mock").text.startswith("used by the scheduler")


@pytest.mark.parametrize("cloud", CLOUD_TYPES)
def test_cpu_and_memory_are_honoured_where_the_adapter_uses_them(cloud: str) -> None:
    by_path = {e.path: e for e in ENTRIES}
    for kind in ("limits", "requests"):
        for name in ("cpu", "memory"):
            entry = by_path[f"spec.containers[0].resources.{kind}[{name}]"]
            decision = entry.rules[cloud].decision
            # RunPod sizes a GPU pod's vCPUs and RAM by the GPU type (providers/runpod.py)
            expected = Decision.WARNED if cloud == "runpod" else Decision.HONOURED
            assert decision is expected


# --------------------------------------------------------------------------------------------
# Paths


def test_values_at_fills_in_the_wildcards() -> None:
    pod = make_pod()
    c0(pod)["resources"]["requests"] = {"cpu": "1", "ephemeral-storage": "1Gi"}
    pattern = "spec.containers[0].resources.{limits,requests}[*]"
    found = dict(fidelity.values_at(pod, pattern=pattern))
    assert found["spec.containers[0].resources.limits[nvidia.com/gpu]"] == "1"
    assert found["spec.containers[0].resources.requests[ephemeral-storage]"] == "1Gi"
    assert fidelity.values_at(pod, pattern="spec.hostNetwork") == []
    assert fidelity.values_at(pod, pattern="spec.volumes[*]")[0][0] == "spec.volumes[0]"


@pytest.mark.parametrize(("pattern", "field", "expected"), [
    ("spec.volumes[*]", "spec.volumes[1].hostPath", True),
    ("spec.containers[0].env[*]", "spec.containers[0].envFrom[0]", False),
    ("spec.containers", "spec.containers[0].image", True),
    ("spec.containers[0].{startupProbe,livenessProbe}.exec",
     "spec.containers[0].livenessProbe.exec", True),
    ("spec.containers[0].resources.limits[cpu]",
     "spec.containers[0].resources.limits[cpu]", True),
    ("spec.containers[0].resources.limits[cpu]",
     "spec.containers[0].resources.limits[memory]", False),
])
def test_matches(pattern: str, field: str, expected: bool) -> None:
    assert fidelity.matches(pattern, field=field) is expected


# --------------------------------------------------------------------------------------------
# Refusals: every entry is exercised, and every refusal translate makes has its entry


def _leaves(obj: Any, prefix: str) -> list[str]:
    if isinstance(obj, dict) and obj:
        return [leaf for k, v in obj.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    if isinstance(obj, list) and obj:
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, f"{prefix}[{i}]")]
    return [prefix]


def bad_pod_fields() -> list[str]:
    """The pod fields the e2e BAD_PODS set (tests/e2e/test_pods.py), as field paths."""
    tree = ast.parse((ROOT / "tests" / "e2e" / "test_pods.py").read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
                and isinstance(n.target, ast.Name) and n.target.id == "BAD_PODS")
    assert node.value is not None
    fields: list[str] = []
    for _, change, _, _ in ast.literal_eval(node.value):
        for key, value in change.items():
            if key == "container":
                fields += _leaves(value, "spec.containers[0]")
            elif key not in ("gpus", "gpu_type"):  # the helper's knobs, not pod fields
                fields += _leaves(value, f"spec.{key}")
    return fields


def translate_refusal_fields() -> list[tuple[str, str]]:
    """(reason, field) of every refusal tests/unit/test_translate.py checks."""
    cases = [(reason, field) for _, _, reason, field in REJECTIONS]
    cases += [("UnsupportedPodSpec", field) for _, _, field in PROBE_CASES if field]
    return cases


def test_bad_pods_are_found() -> None:
    fields = bad_pod_fields()
    assert "spec.hostNetwork" in fields
    assert "spec.containers[0].securityContext.privileged" in fields


def test_every_refusal_entry_is_exercised_by_a_translate_test_or_a_bad_pod() -> None:
    exercised = [f for _, f in translate_refusal_fields()] + bad_pod_fields()
    missing = [e.path for e in translation_refusals()
               if not any(fidelity.matches(e.path, field=f) for f in exercised)]
    assert not missing, f"REFUSED entries no test refuses: {missing}"


@pytest.mark.parametrize(("reason", "field"), translate_refusal_fields())
def test_every_refusal_translate_makes_has_an_entry_with_its_reason(reason: str,
                                                                     field: str) -> None:
    if field.startswith("metadata."):
        return  # not a PodSpec field: the API server never sends such a pod
    candidates = [e for e in translation_refusals() if fidelity.matches(e.path, field=field)]
    assert candidates, f"{field}: refused, but no REFUSED entry names it"
    closest = max(candidates, key=lambda e: len(e.path))
    assert closest.reason == reason, f"{field}: {closest.path} says {closest.reason}"


def _set(pod: dict[str, Any], path: str, value: Any) -> None:
    """Set a plain path (names and [index]) in the pod, creating maps on the way."""
    parts = path.split(".")
    obj: Any = pod
    for part in parts[:-1]:
        name, _, index = part.partition("[")
        obj = obj.setdefault(name, {})
        if index:
            obj = obj[int(index.rstrip("]"))]
    obj[parts[-1]] = value


@pytest.mark.parametrize("entry", fidelity.SIMPLE_REFUSALS, ids=lambda e: e.path)
def test_simple_refusals_come_from_the_table(entry: Entry) -> None:
    pod = make_pod()
    _set(pod, entry.path, True if entry.refuse_if == "true" else [{"name": "x", "image": "y"}])
    with pytest.raises(PodRejected) as info:
        validate(pod)
    assert (info.value.reason, info.value.field) == (entry.reason, entry.path)
    assert info.value.message == entry.refusal
    _set(pod, entry.path, False if entry.refuse_if == "true" else [])
    validate(pod)


def _shm(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    c0(pod)["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})


#: For each entry an adapter refuses: a value that makes it refuse (or a change of the pod).
ADAPTER_REFUSAL_EXAMPLES: dict[str, Any] = {
    "spec.containers[0].command": ["/bin/sh", "-c", "true"],
    "spec.volumes[*].emptyDir": _shm,
}


async def test_adapter_refusals_are_what_the_adapters_do(
    adapter: Callable[[str], Any],
) -> None:
    refused = [(e, c) for e in ENTRIES for c in CLOUD_TYPES if e.rule(c).by_adapter]
    assert {e.path for e, _ in refused} == set(ADAPTER_REFUSAL_EXAMPLES)
    for entry, cloud in refused:
        pod = make_pod()
        example = ADAPTER_REFUSAL_EXAMPLES[entry.path]
        if callable(example):
            example(pod)
        else:
            _set(pod, entry.path, example)
        spec = await translate(pod=pod, node_name=NODE, refs=FakeRefs())
        with pytest.raises(InvalidSpec):
            await adapter(cloud).create(spec)


# --------------------------------------------------------------------------------------------
# Warnings


def warned_pod() -> dict[str, Any]:
    """make_pod() plus a value worth a warning in every field some cloud drops."""
    pod = make_pod()
    spec = pod["spec"]
    spec.update(
        activeDeadlineSeconds=3600, automountServiceAccountToken=True,
        dnsConfig={"nameservers": ["1.1.1.1"]}, dnsPolicy="None",
        hostAliases=[{"ip": "10.0.0.1", "hostnames": ["db"]}], hostUsers=False,
        hostname="llm", hostnameOverride="llm-0", imagePullSecrets=[{"name": "regcred"}],
        os={"name": "windows"}, resourceClaims=[{"name": "gpu", "resourceClaimName": "c"}],
        resources={"limits": {"cpu": "8"}}, restartPolicy="OnFailure",
        runtimeClassName="nvidia", setHostnameAsFQDN=True, shareProcessNamespace=True,
        subdomain="llm", terminationGracePeriodSeconds=300,
        securityContext={
            "appArmorProfile": {"type": "RuntimeDefault"}, "fsGroup": 2000,
            "fsGroupChangePolicy": "OnRootMismatch", "runAsGroup": 3000, "runAsNonRoot": True,
            "runAsUser": 1000, "seLinuxChangePolicy": "Recursive",
            "seLinuxOptions": {"level": "s0:c1"}, "seccompProfile": {"type": "RuntimeDefault"},
            "supplementalGroups": [4000], "supplementalGroupsPolicy": "Strict",
            "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}],
            "windowsOptions": {"runAsUserName": "x"}},
    )
    spec["volumes"].append({"name": "vault-token", "projected": {
        "sources": [{"serviceAccountToken": {"audience": "vault", "path": "token"}}]}})
    container = c0(pod)
    container.update(
        imagePullPolicy="Never", lifecycle={"preStop": {"sleep": {"seconds": 5}}},
        ports=[{"name": "http", "containerPort": 8000, "hostPort": 80}],
        readinessProbe={"httpGet": {"path": "/health", "port": "http"}},
        livenessProbe={"grpc": {"port": 8000}},
        resizePolicy=[{"resourceName": "cpu", "restartPolicy": "RestartContainer"}],
        restartPolicy="Always", restartPolicyRules=[
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}],
        stdin=True, stdinOnce=True, tty=True, terminationMessagePath="/tmp/msg",
        terminationMessagePolicy="FallbackToLogsOnError", workingDir="/app",
        securityContext={
            "allowPrivilegeEscalation": False, "appArmorProfile": {"type": "RuntimeDefault"},
            "capabilities": {"drop": ["ALL"]}, "procMount": "Unmasked",
            "readOnlyRootFilesystem": True, "runAsGroup": 3000, "runAsNonRoot": True,
            "runAsUser": 1000, "seLinuxOptions": {"level": "s0:c1"},
            "seccompProfile": {"type": "RuntimeDefault"}, "windowsOptions": {"hostProcess": False}},
    )
    container["volumeMounts"].append({"name": "vault-token", "mountPath": "/var/run/vault"})
    _shm(pod)  # volumes[2], mounted at /dev/shm: the volume is warned about, not the mount
    container["resources"]["limits"]["ephemeral-storage"] = "50Gi"
    container["resources"]["requests"] = {"hugepages-2Mi": "1Gi", "cpu": "2", "memory": "8Gi"}
    container["resources"]["claims"] = [{"name": "gpu"}]
    return pod


#: What warned_pod() warns about on the mock cloud, exactly.
WARNED_ON_MOCK = {
    "spec.automountServiceAccountToken", "spec.dnsConfig",
    "spec.dnsPolicy", "spec.hostAliases", "spec.hostUsers", "spec.hostname",
    "spec.hostnameOverride", "spec.os.name", "spec.resourceClaims",
    "spec.resources", "spec.runtimeClassName", "spec.setHostnameAsFQDN",
    "spec.shareProcessNamespace", "spec.subdomain", "spec.terminationGracePeriodSeconds",
    "spec.volumes[2].emptyDir",
    *(f"spec.securityContext.{k}" for k in (
        "appArmorProfile", "fsGroup", "fsGroupChangePolicy", "runAsGroup", "runAsNonRoot",
        "runAsUser", "seLinuxChangePolicy", "seLinuxOptions", "seccompProfile",
        "supplementalGroups", "supplementalGroupsPolicy", "sysctls", "windowsOptions")),
    *(f"spec.containers[0].{k}" for k in (
        "imagePullPolicy", "lifecycle", "livenessProbe", "ports[0].hostPort",
        "resizePolicy[0].restartPolicy", "restartPolicy", "restartPolicyRules", "stdin",
        "stdinOnce", "tty", "terminationMessagePath", "terminationMessagePolicy",
        "volumeMounts[1]", "workingDir", "resources.limits[ephemeral-storage]",
        "resources.requests[hugepages-2Mi]", "resources.claims")),
    *(f"spec.containers[0].securityContext.{k}" for k in (
        "allowPrivilegeEscalation", "appArmorProfile", "capabilities", "procMount",
        "readOnlyRootFilesystem", "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxOptions",
        "seccompProfile", "windowsOptions")),
}


def test_a_pod_that_sets_warned_fields_gets_a_warning_for_each() -> None:
    pod = warned_pod()
    validate(pod)  # accepted: warned, not refused
    dropped = fieldcheck.dropped_fields(pod, clouds=("mock",))
    assert {d.field for d in dropped} == WARNED_ON_MOCK
    assert len(dropped) == len(WARNED_ON_MOCK)  # one warning per field
    by_field = {d.field: d.message for d in dropped}
    assert by_field["spec.containers[0].workingDir"] == (
        "not passed to the cloud: the image's WORKDIR applies")
    assert "spec.imagePullSecrets" not in by_field, "sent to every cloud now"
    assert "TCP connect" in by_field["spec.containers[0].livenessProbe"]


@pytest.mark.parametrize("pod", [warned_pod(), make_pod(), {"spec": {"containers": []}},
                                 {"spec": {"containers": "not a list", "securityContext": 7}},
                                 {"spec": {"containers": [{"resources": {
                                     "limits": ["cpu"], "requests": {"0": "1", "cpu": None}}}]}}],
                         ids=["warned", "plain", "no-containers", "wrong-types", "odd-maps"])
def test_direct_lookups_find_what_matching_finds(pod: dict[str, Any]) -> None:
    # dropped_fields looks paths of plain names, indexes and keys up directly (the fast path); for
    # every such entry that must be exactly what the general matcher finds
    steps = {w.entry.path: w.steps for w in fieldcheck._warned_entries(CLOUD_TYPES)[0]
             if w.steps is not None}
    assert len(steps) > 30  # most entries take the fast path
    for path, plain in steps.items():
        value = fieldcheck._plain_value(pod, plain)
        assert fidelity.values_at(pod, pattern=path) == ([] if value is None else [(path, value)])


@pytest.mark.parametrize("pod", [warned_pod(), make_pod(), {"spec": {"containers": []}},
                                 {"spec": {"containers": "not a list", "securityContext": 7}},
                                 {"spec": {"containers": [{"resources": {
                                     "limits": ["cpu"], "requests": {"0": "1", "cpu": None}}}]}},
                                 {"metadata": {}}, {"spec": None}],
                         ids=["warned", "plain", "no-containers", "wrong-types", "odd-maps",
                              "no-spec", "null-spec"])
def test_the_key_index_leaves_out_only_entries_the_pod_does_not_set(pod: dict[str, Any]) -> None:
    # dropped_fields and table_refusal look only at entries under keys the pod sets: every
    # entry left out must be one the general matcher finds nothing for
    tables = [([w.entry for w in warned], index) for warned, index in
              (fieldcheck._warned_entries(CLOUD_TYPES), fieldcheck._warned_entries(("mock",)))]
    tables += [(list(r.entries), r.index) for r in (fieldcheck._refusals(True),
                                                    fieldcheck._refusals(False))]
    for entries, index in tables:
        kept = set(index.candidates(pod))
        assert all(0 <= i < len(entries) for i in kept)
        left_out = [e.path for i, e in enumerate(entries) if i not in kept]
        assert [p for p in left_out if fidelity.values_at(pod, pattern=p)] == []
    assert len(tables[0][1].candidates(make_pod())) < len(tables[0][0]) // 2


def test_every_warned_entry_warns_for_some_value() -> None:
    pod = warned_pod()
    silent = [e.path for e in ENTRIES if Decision.WARNED in e.decisions
              and not any(e.warns(field=f, value=v)
                                  for f, v in fidelity.values_at(pod, pattern=e.path))]
    assert sorted(silent) == sorted(NEVER_WARNED)


def test_runpod_also_warns_about_cpu_and_memory() -> None:
    dropped = fieldcheck.dropped_fields(warned_pod(), clouds=("runpod",))
    extra = {d.field for d in dropped} - WARNED_ON_MOCK
    assert extra == {f"spec.containers[0].resources.{kind}[{name}]"
                     for kind in ("limits", "requests") for name in ("cpu", "memory")} | {
        "spec.restartPolicy"}  # the mock restarts instances; the RunPod adapter not yet


@pytest.mark.parametrize("cloud", ["mock", "vastai", "salad"])
def test_the_plain_pod_gets_no_warning(cloud: str) -> None:
    assert fieldcheck.dropped_fields(make_pod(), clouds=(cloud,)) == ()


def test_the_plain_pod_on_runpod_is_warned_only_that_cpu_and_memory_do_not_size_it() -> None:
    fields = {d.field for d in fieldcheck.dropped_fields(make_pod(), clouds=("runpod",))}
    assert fields == {"spec.containers[0].resources.limits[cpu]",
                      "spec.containers[0].resources.limits[memory]"}


def test_defaults_and_harmless_values_are_not_warned() -> None:
    pod = make_pod()
    pod["spec"].update(restartPolicy="Always", dnsPolicy="ClusterFirst", enableServiceLinks=True,
                       terminationGracePeriodSeconds=30, automountServiceAccountToken=False,
                       hostUsers=True, shareProcessNamespace=False, schedulerName="x",
                       tolerations=[{"operator": "Exists"}], priority=0)
    c0(pod).update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log",
                   terminationMessagePolicy="File", stdin=False, tty=False,
                   resizePolicy=[{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                   securityContext={"privileged": False, "allowPrivilegeEscalation": True,
                                    "readOnlyRootFilesystem": False, "procMount": "Default"})
    assert fieldcheck.dropped_fields(pod, clouds=("mock",)) == ()
    for value in ("Never", "Always"):
        pod["spec"]["restartPolicy"] = value
        assert fieldcheck.dropped_fields(pod, clouds=("mock",)) == ()
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    assert fieldcheck.dropped_fields(pod, clouds=("mock",)) == ()


def test_a_warning_names_the_clouds_when_not_all_of_them_drop_the_field() -> None:
    dropped = fieldcheck.dropped_fields(make_pod(), clouds=("mock", "runpod"))
    assert [d.message.split(":")[0] for d in dropped] == ["on runpod", "on runpod"]
    both = fieldcheck.dropped_fields(warned_pod(), clouds=("mock", "salad"))
    restart = next(d.message for d in both if d.field == "spec.restartPolicy")
    assert restart.startswith("on salad: "), "honoured on the mock (it restarts instances)"
    three = fieldcheck.dropped_fields(warned_pod(), clouds=("mock", "runpod", "salad"))
    restart = next(d.message for d in three if d.field == "spec.restartPolicy")
    assert restart.startswith("on runpod: ") and "; on salad: " in restart


def test_vastai_honours_the_user_and_group_and_warns_only_a_group_without_a_user() -> None:
    on_vast = {d.field for d in fieldcheck.dropped_fields(warned_pod(), clouds=("vastai",))}
    assert not {f for f in on_vast if f.endswith((".runAsUser", ".runAsGroup"))}
    pod = make_pod()
    c0(pod)["securityContext"] = {"runAsGroup": 3000}
    on_vast = {d.field for d in fieldcheck.dropped_fields(pod, clouds=("vastai",))}
    assert on_vast == {"spec.containers[0].securityContext.runAsGroup"}
    pod["spec"]["securityContext"] = {"runAsUser": 1000}  # the pod's user carries the group
    assert fieldcheck.dropped_fields(pod, clouds=("vastai",)) == ()
    assert {d.field for d in fieldcheck.dropped_fields(pod, clouds=("salad",))} == {
        "spec.securityContext.runAsUser", "spec.containers[0].securityContext.runAsGroup"}


def test_vastai_honours_the_hostname() -> None:
    on_vast = {d.field for d in fieldcheck.dropped_fields(warned_pod(), clouds=("vastai",))}
    assert not {"spec.hostname", "spec.hostnameOverride"} & on_vast
    assert "spec.setHostnameAsFQDN" in on_vast


def test_salad_honours_dev_shm_and_the_mount_is_never_warned() -> None:
    pod = make_pod()
    _shm(pod)
    assert fieldcheck.dropped_fields(pod, clouds=("salad",)) == ()
    assert {d.field for d in fieldcheck.dropped_fields(pod, clouds=("mock",))} == {
        "spec.volumes[1].emptyDir"}


def test_every_warning_text_is_in_the_doc() -> None:
    doc = (ROOT / "docs" / "pod-spec.md").read_text()
    for entry in ENTRIES:
        for rule in entry.rules.values():
            if rule.decision is Decision.WARNED:
                assert rule.text in doc, entry.path


# --------------------------------------------------------------------------------------------
# The event message


def test_the_event_message_fits_in_one_kib_and_names_what_fits() -> None:
    dropped = fieldcheck.dropped_fields(warned_pod())
    message = fieldcheck.event_message(dropped)
    assert len(message.encode()) <= 1000
    assert message.startswith("Accepted, but not honoured on the cloud")
    assert "spec.automountServiceAccountToken (no service-account token" in message
    assert message.endswith("more")
    shown = sum(1 for d in dropped if d.field in message)
    assert f"and {len(dropped) - shown} more" in message


def test_a_short_event_message_names_every_field_and_shares_reasons() -> None:
    pod = make_pod()
    c0(pod).update(workingDir="/app", securityContext={"runAsUser": 1, "runAsGroup": 2})
    message = fieldcheck.event_message(fieldcheck.dropped_fields(pod, clouds=("mock",)))
    assert message == (
        "Accepted, but not honoured on the cloud (see docs/pod-spec.md): "
        "spec.containers[0].workingDir (not passed to the cloud: the image's WORKDIR applies); "
        "spec.containers[0].securityContext.runAsGroup, "
        "spec.containers[0].securityContext.runAsUser "
        "(not applied: the cloud runs the container as its image says)")


# --------------------------------------------------------------------------------------------
# translate hands the dropped fields over


async def test_translate_calls_on_dropped_once_with_the_dropped_fields(
    adapter: Callable[[str], Any],
) -> None:
    pod = make_pod()
    c0(pod)["workingDir"] = "/app"
    got: list[FieldsDropped] = []
    await translate(pod=pod, node_name=NODE, refs=FakeRefs(), adapters=[adapter("mock")],
                    on_dropped=got.append)
    assert [d.fields for d in got] == [("spec.containers[0].workingDir",)]
    assert "workingDir" in got[0].message


async def test_translate_does_not_call_on_dropped_for_a_plain_pod(
    adapter: Callable[[str], Any],
) -> None:
    got: list[FieldsDropped] = []
    await translate(pod=make_pod(), node_name=NODE, refs=FakeRefs(), adapters=[adapter("mock")],
                    on_dropped=got.append)
    await translate(pod=make_pod(), node_name=NODE, refs=FakeRefs(),
                    adapters=[adapter("vastai"), adapter("salad")], on_dropped=got.append)
    assert got == []


async def test_translate_does_not_call_on_dropped_when_the_pod_is_refused_or_waits() -> None:
    got: list[FieldsDropped] = []
    refused = make_pod()
    c0(refused).update(workingDir="/app", volumeDevices=[{"name": "b", "devicePath": "/dev/b"}])
    with pytest.raises(PodRejected):
        await translate(pod=refused, node_name=NODE, refs=FakeRefs(), on_dropped=got.append)
    waiting = make_pod()
    c0(waiting).update(workingDir="/app", env=[
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}])
    with pytest.raises(PodConfigPending):
        await translate(pod=waiting, node_name=NODE, refs=FakeRefs(), on_dropped=got.append)
    assert got == []


async def test_an_exec_probe_the_policy_ignores_is_warned_about(
    adapter: Callable[[str], Any],
) -> None:
    pod = make_pod()
    c0(pod)["livenessProbe"] = {"exec": {"command": ["true"]}}
    got: list[FieldsDropped] = []
    await translate(pod=pod, node_name=NODE, refs=FakeRefs(), ignore_exec_probes=True,
                    adapters=[adapter("mock")], on_dropped=got.append)
    assert got[0].fields == ("spec.containers[0].livenessProbe",)


@pytest.mark.parametrize("cloud", CLOUD_TYPES)
def test_each_adapter_is_known_by_its_cloud_type(cloud: str,
                                                 adapter: Callable[[str], Any]) -> None:
    assert fieldcheck.cloud_type(adapter(cloud)) == cloud


def test_the_adapters_choose_the_clouds_warned_for(adapter: Callable[[str], Any]) -> None:
    runpod, mock = adapter("runpod"), adapter("mock")
    only = fields_dropped(make_pod(), adapters=[runpod]).entries
    assert [d.message for d in only][1] == "ignored: RunPod sizes RAM by the GPU type"
    assert fields_dropped(make_pod(), adapters=[mock]).entries == ()
    assert fields_dropped(make_pod(), adapters=[mock, runpod]).entries[0].message.startswith(
        "on runpod: ")
    # unknown adapters (fakes) and None: every cloud type
    unknown = fields_dropped(make_pod(), adapters=[object()])
    assert unknown == fields_dropped(make_pod(), adapters=None)
    assert unknown.entries


# --------------------------------------------------------------------------------------------
# The document


def test_the_doc_is_the_table_rendered() -> None:
    rendered = fidelitydoc.render_markdown()
    current = (ROOT / "docs" / "pod-spec.md").read_text()
    assert current == rendered, "docs/pod-spec.md is stale: python -m vkprovider.node.fidelitydoc"


def test_the_doc_has_a_row_per_entry(tmp_path: Path) -> None:
    doc = fidelitydoc.render_markdown()
    rows = [line for line in doc.splitlines() if line.startswith("| `spec.")]
    assert len(rows) == len(ENTRIES)
    out = tmp_path / "pod-spec.md"
    assert fidelitydoc.main([str(out)]) == 0
    assert fidelitydoc.main(["--check", str(out)]) == 0
    out.write_text(doc + "edited\n")
    assert fidelitydoc.main(["--check", str(out)]) == 1


def test_the_table_refuses_an_inconsistent_entry() -> None:
    bad = dataclasses.replace(ENTRIES[0], refuse_if="true")
    with pytest.raises(fidelity.FidelityError):
        fidelity._check([bad])


def test_a_pattern_that_does_not_parse_is_named() -> None:
    with pytest.raises(fieldpaths.FieldPatternError, match=r"spec\.containers\.\.image"):
        fieldpaths.segments("spec.containers..image")
