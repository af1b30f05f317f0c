"""Admission under a $/h cap admits a surge at once, within the cap (issue 36, item 10).

The admission decision of one pass, with the watches' stores filled by hand (unit test: the API
is a recording stand-in that accepts every write). The cap used to admit one pod, then wait
until the cloud priced it: a pre-warm surge of 12 replicas came up one per cloud round trip.
Now a pod not priced yet counts at the price per GPU the policy's cloud pods pay, or at the
dearest offer the policy could take as the provider publishes it on its Node, whichever is
higher; only with no price known at all does the companion admit one and wait.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.descheduler.fit import slim_pod
from vkprovider.kube.events import EventRecorder
from vkprovider.placement.budget import POLICY_ANNOTATION, PRICE_ANNOTATION, Usage
from vkprovider.semantics.timefmt import format_time

NODE = "vk-test"
NS = "serving"


class AcceptingAPI:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    async def patch(self, path: str, body: Any, **_kw: Any) -> dict[str, Any]:
        self.requests.append(("PATCH", path, body))
        return {}

    async def create(self, path: str, body: Any, **_kw: Any) -> dict[str, Any]:
        self.requests.append(("POST", path, body))
        return {}

    def admitted(self) -> list[str]:
        return sorted(path.rsplit("/", 1)[1] for method, path, body in self.requests
                      if method == "PATCH" and "/pods/" in path
                      and POLICY_ANNOTATION in ((body.get("metadata") or {}).get("annotations")
                                                or {}))


def pod(name: str, *, node: str | None = None, annotations: dict[str, str] | None = None,
        unschedulable: bool = False) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                   "lastTransitionTime": format_time(datetime.now(UTC) - timedelta(seconds=5))}
                  ] if unschedulable else []
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "resourceVersion": "1", "labels": {"app": "web"},
                         "creationTimestamp": f"2026-01-01T00:00:{len(name):02d}Z",
                         "annotations": annotations or {}},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "resources": {
                         "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending" if not node else "Running",
                       "conditions": conditions}}


def admission(*, cap: float, cloud: list[dict[str, Any]], surge: int) -> tuple[
        OverflowAdmission, AcceptingAPI]:
    api = AcceptingAPI()
    adm = OverflowAdmission(client=api,  # type: ignore[arg-type]
                            events=EventRecorder(client=api,  # type: ignore[arg-type]
                                                 component="test"),
                            node_names=[NODE])
    adm.policies.store["burst"] = {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
        "metadata": {"name": "burst", "generation": 1},
        "spec": {"selector": {"podSelector": {"matchLabels": {"app": "web"}}},
                 "providers": ["mock"], "limits": {"maxPricePerHour": cap},
                 "overflowAfter": "0s"}}
    for p in cloud:
        adm.pods.store[f"{NS}/{p['metadata']['name']}"] = slim_pod(p)
    for i in range(surge):
        p = pod(f"surge-{i:02d}", unschedulable=True)
        adm.pending.store[f"{NS}/{p['metadata']['name']}"] = p
        adm.pods.store[f"{NS}/{p['metadata']['name']}"] = slim_pod(p)
    return adm, api


def priced(name: str, price: str) -> dict[str, Any]:
    return pod(name, node=NODE, annotations={POLICY_ANNOTATION: "burst",
                                             PRICE_ANNOTATION: price})


async def test_a_surge_is_admitted_at_once_at_the_price_the_policys_pods_pay() -> None:
    adm, api = admission(cap=10.0, cloud=[priced("cloud-0", "0.5")], surge=12)
    await adm.pass_once()
    assert len(api.admitted()) == 12  # 0.5 + 12 x 0.5 = 6.5 <= 10, in one pass


async def test_the_cap_still_binds_counting_each_pod_at_that_price() -> None:
    adm, api = admission(cap=3.0, cloud=[priced("cloud-0", "0.5")], surge=12)
    await adm.pass_once()
    assert len(api.admitted()) == 5  # 0.5 + 5 x 0.5 = 3.0; a sixth would be 3.5


async def test_pods_not_priced_yet_count_at_the_estimate_across_passes() -> None:
    # two admitted by an earlier pass, on the node, no price yet: 1.0 + 2 x 1.0 = 3 of 4
    cloud = [priced("cloud-0", "1.0"),
             pod("early-a", node=NODE, annotations={POLICY_ANNOTATION: "burst"}),
             pod("early-b", node=NODE, annotations={POLICY_ANNOTATION: "burst"})]
    adm, api = admission(cap=4.0, cloud=cloud, surge=6)
    await adm.pass_once()
    assert len(api.admitted()) == 1


async def test_with_no_price_known_one_pod_goes_first() -> None:
    adm, api = admission(cap=10.0, cloud=[], surge=12)
    await adm.pass_once()
    assert len(api.admitted()) == 1
    await adm.pass_once()  # still not priced: the next waits
    assert len(api.admitted()) == 1


def test_committed_usage_prices_the_unpriced_at_the_policys_rate() -> None:
    from vkprovider.descheduler.admission import committed_usage

    usage = {"a": Usage(pods=3, gpus=4, price_per_hour=2.0)}
    out = committed_usage(usage, unpriced_gpus={"a": 2, "b": 1},
                          price_per_gpu={"a": 0.75})
    assert out["a"] == Usage(pods=3, gpus=4, price_per_hour=3.5)
    assert out["b"] == Usage(pods=0, gpus=0, price_per_hour=0.0)
    assert usage["a"].price_per_hour == 2.0  # not changed in place


# ---- no pod priced yet: the offers' prices the provider publishes on its Node ------------------

def node(name: str = NODE, prices: str | None = None) -> dict[str, Any]:
    from vkprovider.descheduler.admission import _slim_node
    from vkprovider.placement.offerprices import OFFER_PRICES_ANNOTATION

    annotations = {} if prices is None else {OFFER_PRICES_ANNOTATION: prices}
    return _slim_node({"metadata": {"name": name, "uid": f"uid-{name}",
                                    "annotations": annotations},
                       "spec": {"taints": []}})


def published(adm: OverflowAdmission, prices: str | None, name: str = NODE) -> None:
    adm.virtual_nodes.store[name] = node(name, prices)


MOCK_OFFERS = ('{"mock":{"H100":{"min":0.5,"max":1.0},"A100":{"min":0.4,"max":0.6}},'
               '"elsewhere":{"H100":{"min":9.0,"max":9.0}}}')


async def test_with_no_pod_priced_the_published_offers_admit_the_surge_at_once() -> None:
    adm, api = admission(cap=12.0, cloud=[], surge=12)
    published(adm, MOCK_OFFERS)
    await adm.pass_once()
    assert len(api.admitted()) == 12  # 12 x $1.00 (the dearest offer) = $12


async def test_the_estimate_is_the_dearest_offer_the_policy_could_take() -> None:
    # $1.00 (mock's H100), not $0.40 or $0.50 (cheapest) nor $9 (an account it does not use)
    adm, api = admission(cap=3.5, cloud=[], surge=12)
    published(adm, MOCK_OFFERS)
    await adm.pass_once()
    assert len(api.admitted()) == 3
    await adm.pass_once()  # counted at $1.00 each while unpriced: no room for a fourth
    assert len(api.admitted()) == 3


async def test_the_policys_gpu_types_narrow_the_offers_it_could_take() -> None:
    adm, api = admission(cap=3.0, cloud=[], surge=12)
    adm.policies.store["burst"]["spec"]["gpuTypes"] = ["A100"]
    published(adm, MOCK_OFFERS)
    await adm.pass_once()
    assert len(api.admitted()) == 5  # 5 x $0.60 = $3.00


async def test_a_paid_price_below_the_dearest_offer_does_not_lower_the_estimate() -> None:
    # a pod priced at $0.50 (the cheap offer); the next may take the $1.00 one
    adm, api = admission(cap=3.0, cloud=[priced("cloud-0", "0.5")], surge=12)
    published(adm, MOCK_OFFERS)
    await adm.pass_once()
    assert len(api.admitted()) == 2  # 0.5 + 2 x 1.0 = 2.5; a third would be 3.5


async def test_with_nothing_published_one_pod_goes_first() -> None:
    adm, api = admission(cap=12.0, cloud=[], surge=12)
    published(adm, None)  # an older provider: no annotation
    await adm.pass_once()
    await adm.pass_once()
    assert len(api.admitted()) == 1


async def test_a_node_the_policy_may_use_with_nothing_published_means_one_pod_first() -> None:
    api = AcceptingAPI()
    adm = OverflowAdmission(client=api,  # type: ignore[arg-type]
                            events=EventRecorder(client=api,  # type: ignore[arg-type]
                                                 component="test"),
                            node_names=[NODE, "vk-other"])
    two, _ = admission(cap=12.0, cloud=[], surge=12)
    adm.policies.store.update(two.policies.store)
    adm.pending.store.update(two.pending.store)
    adm.pods.store.update(two.pods.store)
    published(adm, MOCK_OFFERS)
    published(adm, None, name="vk-other")  # may take the pod at a price nobody published
    await adm.pass_once()
    assert len(api.admitted()) == 1


async def test_no_offer_of_the_policys_providers_means_one_pod_first() -> None:
    adm, api = admission(cap=12.0, cloud=[], surge=12)
    published(adm, '{"elsewhere":{"H100":{"min":1,"max":1}}}')
    await adm.pass_once()
    assert len(api.admitted()) == 1


async def test_a_junk_annotation_is_ignored_with_a_warning(caplog: Any) -> None:
    from vkprovider.placement.offerprices import MAX_ANNOTATION_BYTES

    for junk in ("{not json", '["mock"]', '{"mock":{"H100":{"min":2,"max":1}}}',
                 '{"mock":{"H100":{"min":-1,"max":1}}}', '{"mock":{"H100":{"min":0,"max":1e999}}}',
                 '{"mock":{"H100":{"min":true,"max":1}}}', '{"mock":{"H100":{"max":1}}}',
                 '{"mock":{"H100":{"min":0.5,"max":1}}}' + " " * MAX_ANNOTATION_BYTES,
                 "[" * 100_000):
        caplog.clear()
        adm, api = admission(cap=12.0, cloud=[], surge=12)
        published(adm, junk)
        assert "ignoring the node's offer prices" in caplog.text, junk[:40]
        await adm.pass_once()
        await adm.pass_once()
        assert len(api.admitted()) == 1, junk[:40]
