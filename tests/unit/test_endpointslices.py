"""The pure parts of provider-managed EndpointSlices: matching, target ports, grouping, naming,
diffing; and the controller's bookkeeping with a fake API (no cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vkprovider.kube.errors import ConflictError, NotFoundError
from vkprovider.metrics import Metrics
from vkprovider.node.endpointslices import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_ENDPOINTS,
    NODE_LABEL,
    SERVICE_NAME_LABEL,
    EndpointSliceController,
    EndpointTarget,
    PodRecord,
    SlicePort,
    address_family,
    build_slices,
    endpoints_for,
    group_endpoints,
    resolve_target_port,
    selects,
    slice_differs,
    slice_name,
    update_body,
)

NODE = "vk-test"


def svc(name: str = "web", *, selector: dict[str, str] | None = None,
        ports: list[dict[str, Any]] | None = None, type_: str = "ClusterIP",
        uid: str = "svc-uid", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"type": type_,
                     **({"selector": selector} if selector is not None else {}),
                     "ports": ports if ports is not None else
                     [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
                     **spec}}


def target(port: int = 8080, *, host: str = "198.18.0.1", published: int = 40001,
           kind: str = "ip", ready: bool = True, serving: bool = True,
           terminating: bool = False, protocol: str = "TCP") -> EndpointTarget:
    return EndpointTarget(container_port=port, protocol=protocol, host=host, port=published,
                          kind=kind,  # type: ignore[arg-type]
                          ready=ready, serving=serving, terminating=terminating)


def pod(uid: str = "p1", *, labels: dict[str, str] | None = None,
        ports: tuple[tuple[str, str | None, int, str], ...] = (("main", "http", 8080, "TCP"),),
        endpoints: tuple[EndpointTarget, ...] | None = None) -> PodRecord:
    return PodRecord(namespace="ns", name=f"pod-{uid}", uid=uid,
                     labels=tuple(sorted((labels or {"app": "web"}).items())),
                     container_ports=ports,
                     endpoints=endpoints if endpoints is not None else (target(),))


# ---- which Services, which ports ----------------------------------------------------------------


def test_only_services_with_a_selector_and_not_external_name_are_managed() -> None:
    assert selects(svc(selector={"app": "web"})) == {"app": "web"}
    assert selects(svc(selector=None)) is None
    assert selects(svc(selector={})) is None
    assert selects(svc(selector={"app": "web"}, type_="ExternalName")) is None
    assert selects(svc(selector={"app": "web"}, type_="LoadBalancer")) == {"app": "web"}


def test_target_port_resolution_follows_the_stock_controller() -> None:
    ports = (("main", "http", 8080, "TCP"), ("main", "dns", 53, "UDP"), ("side", "metrics", 9090,
                                                                         "TCP"))
    assert resolve_target_port({"port": 80, "targetPort": 8080}, ports) == 8080
    assert resolve_target_port({"port": 80, "targetPort": 7777}, ports) == 7777  # undeclared ok
    assert resolve_target_port({"port": 80, "targetPort": "http"}, ports) == 8080
    assert resolve_target_port({"port": 80, "targetPort": "metrics"}, ports) == 9090
    assert resolve_target_port({"port": 80}, ports) == 80  # default: the port
    assert resolve_target_port({"port": 80, "targetPort": "nope"}, ports) is None
    # a named port matches only with the Service port's protocol
    assert resolve_target_port({"port": 53, "targetPort": "dns"}, ports) is None
    assert resolve_target_port({"port": 53, "targetPort": "dns", "protocol": "UDP"}, ports) == 53


def test_addresses_the_api_server_refuses_are_not_published() -> None:
    assert address_family("198.18.0.7") == ("198.18.0.7", "IPv4")
    assert address_family("2001:db8:0:0::1") == ("2001:db8::1", "IPv6")
    assert address_family("[2001:db8::1]") == ("2001:db8::1", "IPv6")
    assert address_family("::ffff:198.18.0.7") == ("198.18.0.7", "IPv4")
    for bad in ("127.0.0.1", "::1", "0.0.0.0", "::", "169.254.1.1", "fe80::1", "224.0.0.5",
                "ff02::1", "example.com", ""):
        assert address_family(bad) is None, bad


# ---- endpoints of one pod ----------------------------------------------------------------------


def test_a_service_port_resolves_to_the_published_host_and_port() -> None:
    eps, bad = endpoints_for(svc(selector={"app": "web"}), pod())
    assert not bad
    [ep] = eps
    assert (ep.address, ep.family) == ("198.18.0.1", "IPv4")
    assert ep.ports == (SlicePort("http", "TCP", 40001),)
    assert (ep.ready, ep.serving, ep.terminating) == (True, True, False)


def test_the_first_ip_target_wins_and_hostname_only_ports_are_unroutable() -> None:
    p = pod(endpoints=(target(kind="hostname", host="abc-8080.proxy.example", published=443),
                       target(host="198.18.0.9", published=41000)))
    [ep], bad = endpoints_for(svc(selector={"app": "web"}), p)
    assert (ep.address, ep.ports[0].port) == ("198.18.0.9", 41000) and not bad
    only_name = pod(endpoints=(target(kind="hostname", host="x.salad.example", published=443),))
    eps, bad = endpoints_for(svc(selector={"app": "web"}), only_name)
    assert eps == []
    [u] = bad
    assert (u.why, u.host, u.port, u.port_name, u.container_port) == (
        "hostname", "x.salad.example", 443, "http", 8080)
    loop = pod(endpoints=(target(host="127.0.0.1"),))
    eps, bad = endpoints_for(svc(selector={"app": "web"}), loop)
    assert eps == [] and bad[0].why == "address"


def test_an_unpublished_port_or_unresolvable_name_gives_no_endpoint_port() -> None:
    service = svc(selector={"app": "web"}, ports=[
        {"name": "http", "port": 80, "targetPort": "http"},
        {"name": "grpc", "port": 90, "targetPort": "grpc"},  # not declared
        {"name": "admin", "port": 91, "targetPort": 9000}])  # declared nowhere, not published
    [ep], bad = endpoints_for(service, pod())
    assert [p.name for p in ep.ports] == ["http"] and not bad
    # nothing published yet: no endpoint at all
    assert endpoints_for(service, pod(endpoints=())) == ([], [])


def test_conditions_come_from_the_targets_and_publish_not_ready() -> None:
    not_ready = pod(endpoints=(target(ready=False, serving=False),))
    [ep], _ = endpoints_for(svc(selector={"app": "web"}), not_ready)
    assert (ep.ready, ep.serving, ep.terminating) == (False, False, False)
    draining = pod(endpoints=(target(ready=True, serving=True, terminating=True),))
    [ep], _ = endpoints_for(svc(selector={"app": "web"}), draining)
    assert (ep.ready, ep.serving, ep.terminating) == (False, True, True)
    [ep], _ = endpoints_for(svc(selector={"app": "web"}, publishNotReadyAddresses=True),
                            not_ready)
    assert ep.ready is True


def test_ports_published_at_different_addresses_make_separate_endpoints() -> None:
    service = svc(selector={"app": "web"}, ports=[
        {"name": "http", "port": 80, "targetPort": 8080},
        {"name": "grpc", "port": 90, "targetPort": 9000}])
    p = pod(endpoints=(target(8080, host="198.18.0.1", published=40001),
                       target(9000, host="198.18.0.2", published=40002)))
    eps, _ = endpoints_for(service, p)
    assert [(e.address, [q.name for q in e.ports]) for e in eps] == [
        ("198.18.0.1", ["http"]), ("198.18.0.2", ["grpc"])]


def test_a_headless_service_without_ports_gets_the_addresses() -> None:
    [ep], _ = endpoints_for(svc(selector={"app": "web"}, ports=[], clusterIP="None"), pod())
    assert ep.address == "198.18.0.1" and ep.ports == ()


# ---- grouping, naming, bodies ------------------------------------------------------------------


def _pods_with_ports(*published: int, host: str = "198.18.0.{i}") -> list[PodRecord]:
    return [pod(f"p{i}", endpoints=(target(host=host.format(i=i + 1), published=port),))
            for i, port in enumerate(published)]


def test_endpoints_are_grouped_by_port_set_and_family() -> None:
    pods = _pods_with_ports(40001, 40001, 40002)
    pods.append(pod("p6", endpoints=(target(host="2001:db8::6", published=40001),)))
    eps = [e for p in pods for e in endpoints_for(svc(selector={"app": "web"}), p)[0]]
    groups = group_endpoints(eps)
    assert sorted((fam, ports[0].port, len(items)) for (fam, ports), items in groups.items()) == [
        ("IPv4", 40001, 2), ("IPv4", 40002, 1), ("IPv6", 40001, 1)]


def test_slices_have_the_shape_kube_proxy_reads() -> None:
    service = svc(selector={"app": "web"})
    slices, bad = build_slices(service=service, node=NODE, pods=_pods_with_ports(40001, 40001))
    assert not bad
    [(name, body)] = slices.items()
    assert body["metadata"]["name"] == name and name.startswith("web-")
    assert body["metadata"]["labels"] == {SERVICE_NAME_LABEL: "web",
                                          MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: NODE}
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-uid",
         "controller": True, "blockOwnerDeletion": True}]
    assert body["addressType"] == "IPv4"
    assert body["ports"] == [{"name": "http", "protocol": "TCP", "port": 40001}]
    assert body["endpoints"][0] == {
        "addresses": ["198.18.0.1"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": "ns", "name": "pod-p0", "uid": "p0"},
        "nodeName": NODE}
    assert len(body["endpoints"]) == 2


def test_a_large_group_is_split_into_slices_of_at_most_max_endpoints() -> None:
    pods = [pod(f"p{i:04d}", endpoints=(target(host=f"198.18.{i // 250}.{i % 250 + 1}"),))
            for i in range(MAX_ENDPOINTS * 2 + 5)]
    slices, _ = build_slices(service=svc(selector={"app": "web"}), node=NODE, pods=pods)
    assert sorted(len(b["endpoints"]) for b in slices.values()) == [5, MAX_ENDPOINTS,
                                                                    MAX_ENDPOINTS]
    assert len(set(slices)) == 3


def test_slice_names_are_deterministic_bounded_and_distinct() -> None:
    ports = [SlicePort("http", "TCP", 40001)]
    name = slice_name("web", NODE, "IPv4", ports)
    assert name == slice_name("web", NODE, "IPv4", list(reversed(ports)))
    assert name != slice_name("web", "vk-other", "IPv4", ports)
    assert name != slice_name("web", NODE, "IPv6", ports)
    assert name != slice_name("web", NODE, "IPv4", [SlicePort("http", "TCP", 40002)])
    long_a, long_b = "a" * 62 + "b", "a" * 62 + "c"
    for n in (slice_name(long_a, NODE, "IPv4", ports, 3), slice_name(long_b, NODE, "IPv4", ports)):
        assert len(n) <= 63 and not n.startswith("-")
    assert slice_name(long_a, NODE, "IPv4", ports) != slice_name(long_b, NODE, "IPv4", ports)
    assert "--" not in slice_name("a" * 51 + "-x", NODE, "IPv4", ports)


# ---- diffing ------------------------------------------------------------------------------------


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the API server returns it: extra metadata, foreign labels, defaulted order."""
    out = {**body, "metadata": {**body["metadata"], "resourceVersion": "42", "uid": "s-uid",
                                "creationTimestamp": "2025-01-01T00:00:00Z",
                                "labels": {**body["metadata"]["labels"], "team": "x"},
                                "generation": 1}}
    out["endpoints"] = list(reversed(body["endpoints"]))
    return out


def test_no_update_when_only_server_fields_differ() -> None:
    slices, _ = build_slices(service=svc(selector={"app": "web"}), node=NODE,
                             pods=_pods_with_ports(40001, 40001))
    [body] = slices.values()
    assert not slice_differs(_stored(body), body)


def test_an_update_when_readiness_owner_or_ports_change() -> None:
    service = svc(selector={"app": "web"})
    [body] = build_slices(service=service, node=NODE, pods=_pods_with_ports(40001))[0].values()
    stored = _stored(body)
    flipped = [pod("p0", endpoints=(target(host="198.18.0.1", ready=False),))]
    [changed] = build_slices(service=service, node=NODE, pods=flipped)[0].values()
    assert slice_differs(stored, changed)
    recreated = svc(selector={"app": "web"}, uid="svc-uid-2")
    [owner] = build_slices(service=recreated, node=NODE, pods=_pods_with_ports(40001))[0].values()
    assert slice_differs(stored, owner)
    renamed = svc(selector={"app": "web"}, ports=[{"name": "web", "port": 80,
                                                   "targetPort": 8080}])
    [port] = build_slices(service=renamed, node=NODE, pods=_pods_with_ports(40001))[0].values()
    assert slice_differs(stored, port)
    stripped = {**stored, "metadata": {**stored["metadata"], "labels": {}}}
    assert slice_differs(stripped, body)


def test_an_update_keeps_the_resource_version_and_foreign_labels() -> None:
    [body] = build_slices(service=svc(selector={"app": "web"}), node=NODE,
                          pods=_pods_with_ports(40001))[0].values()
    stored = _stored(body)
    out = update_body(stored, body)
    assert out["metadata"]["resourceVersion"] == "42"
    assert out["metadata"]["labels"]["team"] == "x"
    assert out["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert out["endpoints"] == body["endpoints"]


# ---- the controller against a fake API ----------------------------------------------------------


class FakeAPI:
    """Just enough of KubeClient for reconcile(): slices by path, write log, injected faults."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, str]] = []
        self.fail_next: list[Exception] = []
        self.rv = 0

    def _stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv),
                                     "uid": body["metadata"].get("uid", f"uid-{self.rv}")}}
        return body

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.log.append(("create", body["metadata"]["name"]))
        if self.fail_next:
            raise self.fail_next.pop(0)
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise ConflictError("exists", status=409)
        self.objects[full] = self._stamp(body)
        return self.objects[full]

    async def request(self, method: str, path: str, *, body: dict[str, Any]) -> dict[str, Any]:
        assert method == "PUT"
        self.log.append(("update", body["metadata"]["name"]))
        if self.fail_next:
            raise self.fail_next.pop(0)
        if path not in self.objects:
            raise NotFoundError("gone", status=404)
        if self.objects[path]["metadata"]["resourceVersion"] != body["metadata"][
                "resourceVersion"]:
            raise ConflictError("stale", status=409)
        self.objects[path] = self._stamp({**body, "metadata": {
            **body["metadata"], "uid": self.objects[path]["metadata"]["uid"]}})
        return self.objects[path]

    async def get(self, path: str) -> dict[str, Any]:
        if path not in self.objects:
            raise NotFoundError("gone", status=404)
        return self.objects[path]

    async def delete(self, path: str, *, uid: str | None = None) -> dict[str, Any]:
        self.log.append(("delete", path.rsplit("/", 1)[1]))
        if self.objects.pop(path, None) is None:
            raise NotFoundError("gone", status=404)
        return {}


def controller(api: FakeAPI, metrics: Metrics | None = None) -> EndpointSliceController:
    ctl = EndpointSliceController(client=api, node=NODE, metrics=metrics,  # type: ignore[arg-type]
                                  batch_seconds=0)
    ctl.running = True
    return ctl


def add_service(ctl: EndpointSliceController, service: dict[str, Any]) -> str:
    ctl.services.store["ns/" + service["metadata"]["name"]] = service
    ctl._on_service("ADDED", service)
    return "ns/" + service["metadata"]["name"]


def tell(ctl: EndpointSliceController, p: PodRecord) -> None:
    ctl.set_pod(namespace=p.namespace, name=p.name, uid=p.uid, labels=p.label_map,
                container_ports=p.container_ports, endpoints=p.endpoints)


async def test_unchanged_pods_cost_no_write_and_changes_are_coalesced() -> None:
    api = FakeAPI()
    ctl = controller(api)
    key = add_service(ctl, svc(selector={"app": "web"}))
    for p in _pods_with_ports(40001, 40001):
        tell(ctl, p)
    assert len(ctl.queue) == 1  # two pods, one Service: one reconcile
    await ctl.queue.get()
    await ctl.reconcile(key)
    ctl.queue.done(key)
    assert [op for op, _ in api.log] == ["create"]
    for p in _pods_with_ports(40001, 40001):  # a probe tick with no news
        tell(ctl, p)
    assert len(ctl.queue) == 0
    await ctl.reconcile(key)  # a spurious reconcile writes nothing either
    assert [op for op, _ in api.log] == ["create"]
    tell(ctl, pod("p0", endpoints=(target(host="198.18.0.1", ready=False),)))
    await ctl.reconcile(key)
    assert [op for op, _ in api.log] == ["create", "update"]
    [stored] = api.objects.values()
    conds = {e["targetRef"]["uid"]: e["conditions"]["ready"] for e in stored["endpoints"]}
    assert conds == {"p0": False, "p1": True}


async def test_pods_of_other_namespaces_or_labels_do_not_count() -> None:
    api = FakeAPI()
    ctl = controller(api)
    key = add_service(ctl, svc(selector={"app": "web"}))
    tell(ctl, pod("p0", labels={"app": "other"}))
    other = pod("p1")
    ctl.set_pod(namespace="elsewhere", name="x", uid="p1", labels=other.label_map,
                container_ports=other.container_ports, endpoints=other.endpoints)
    await ctl.reconcile(key)
    assert api.log == []


async def test_removing_the_last_pod_deletes_its_slice_and_not_found_is_fine() -> None:
    api = FakeAPI()
    ctl = controller(api)
    key = add_service(ctl, svc(selector={"app": "web"}))
    tell(ctl, pod("p0"))
    await ctl.reconcile(key)
    ctl.remove_pod(uid="p0")
    api.objects.clear()  # the garbage collector was faster
    await ctl.reconcile(key)
    assert [op for op, _ in api.log] == ["create", "delete"]
    assert not ctl.slices.store and not ctl._slices_by_service


async def test_a_create_conflict_adopts_the_slice_by_name() -> None:
    api = FakeAPI()
    ctl = controller(api)
    key = add_service(ctl, svc(selector={"app": "web"}))
    tell(ctl, pod("p0"))
    [(name, body)] = ctl.desired(key)[0].items()
    path = f"/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices/{name}"
    api.objects[path] = {**body, "metadata": {"name": name, "namespace": "ns", "labels": {},
                                              "resourceVersion": "7", "uid": "old"},
                         "endpoints": []}
    await ctl.reconcile(key)
    assert [op for op, _ in api.log] == ["create", "update"]
    assert api.objects[path]["metadata"]["labels"][NODE_LABEL] == NODE
    assert len(api.objects[path]["endpoints"]) == 1


async def test_a_stale_update_raises_for_a_retry_with_backoff() -> None:
    api = FakeAPI()
    ctl = controller(api)
    key = add_service(ctl, svc(selector={"app": "web"}))
    tell(ctl, pod("p0"))
    await ctl.reconcile(key)
    api.fail_next.append(ConflictError("stale", status=409))
    tell(ctl, pod("p0", endpoints=(target(ready=False),)))
    with pytest.raises(Exception, match="stale"):
        await ctl.reconcile(key)
    await ctl.reconcile(key)  # the next attempt goes through
    [stored] = api.objects.values()
    assert stored["endpoints"][0]["conditions"]["ready"] is False


async def test_hostname_only_pods_are_counted_and_told_once() -> None:
    api = FakeAPI()
    metrics = Metrics()
    ctl = controller(api, metrics)
    told: list[dict[str, Any]] = []

    class Events:
        def record(self, **kw: Any) -> None:
            told.append(kw)

    ctl.events = Events()  # type: ignore[assignment]
    key = add_service(ctl, svc(selector={"app": "web"}))
    tell(ctl, pod("p0", endpoints=(target(kind="hostname", host="x.example", published=443),)))
    await ctl.reconcile(key)
    await ctl.reconcile(key)
    assert api.log == []
    [event] = told
    assert event["reason"] == "EndpointNotRoutable" and event["type_"] == "Warning"
    assert event["obj"]["kind"] == "Service" and "vkprovider.io/ports" in event["message"]
    assert "x.example:443" in event["message"]
    value = metrics.registry.get_sample_value("vkprovider_endpointslice_hostname_only_endpoints")
    assert value == 1
    ctl.remove_pod(uid="p0")
    await ctl.reconcile(key)
    assert metrics.registry.get_sample_value(
        "vkprovider_endpointslice_hostname_only_endpoints") == 0
    # a second controller on the same registry (a new leader term) does not re-register
    controller(api, metrics)


async def test_waits_for_the_pods_before_the_first_pass() -> None:
    class Silent(FakeAPI):
        pass

    ctl = EndpointSliceController(client=Silent(), node=NODE,  # type: ignore[arg-type]
                                  pods_sync_timeout=0.05)
    ctl.services.synced.set()
    ctl.slices.synced.set()
    ctl.services.run = ctl.slices.run = asyncio.Event().wait  # type: ignore[method-assign]
    task = asyncio.create_task(ctl.run())
    await asyncio.sleep(0.01)
    assert not ctl.started.is_set()
    await asyncio.wait_for(ctl.started.wait(), 1)  # the timeout lets it go on
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
