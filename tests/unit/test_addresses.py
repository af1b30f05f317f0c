"""The one filter for addresses clouds publish (providers/addresses.py), class by class.

Every range the issue names is refused, each with its reason; what labs publish (198.18.0.0/15)
and public addresses are allowed; the cluster's own ranges and the operator's trusted ranges do
what the settings say. Behind every adapter: what each adapter reports from a hostile cloud
answer is refused by the pod controller's screen, whichever adapter it came from.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from providers import runpod, salad, vastai
from providers.addresses import (
    DEFAULT_POLICY,
    REASONS,
    AddressPolicy,
    describe,
    refusal,
    screen,
)
from providers.base import TAG_NODE, TAG_UID, Instance, InstanceState, Provider, PublishedPort
from providers.mock import client as mock_client
from vkprovider.config import Settings, load_settings
from vkprovider.errors import ConfigError
from vkprovider.metrics import Metrics
from vkprovider.node import addressscreen, podsweep
from vkprovider.node.addressscreen import AddressScreen
from vkprovider.node.pods import PodController

REFUSED_IPS: list[tuple[str, str]] = [
    # RFC 1918
    ("10.0.0.5", "private"), ("10.255.255.255", "private"), ("172.16.0.1", "private"),
    ("172.31.255.254", "private"), ("192.168.1.1", "private"),
    # carrier-grade NAT
    ("100.64.0.1", "cgnat"), ("100.127.255.254", "cgnat"),
    # link-local
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"), ("fe80::1%eth0", "link-local"),
    ("febf::1", "link-local"),
    # loopback
    ("127.0.0.1", "loopback"), ("127.1.2.3", "loopback"), ("::1", "loopback"),
    # multicast
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    # unspecified / this network
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    # reserved, broadcast
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"),
    # IPv6 unique local (and site-local)
    ("fc00::1", "ula"), ("fd12:3456::1", "ula"), ("fec0::1", "ula"),
    # cloud metadata (before any other class they also belong to)
    ("169.254.169.254", "metadata"), ("169.254.170.2", "metadata"),
    ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
    ("192.0.0.192", "metadata"), ("168.63.129.16", "metadata"), ("fd20:ce::254", "metadata"),
    # IPv4 carried in IPv6: judged by the IPv4 address
    ("::ffff:10.0.0.5", "private"), ("::ffff:169.254.169.254", "metadata"),
    ("::ffff:127.0.0.1", "loopback"), ("::10.0.0.5", "private"),
    ("2002:a00:5::1", "private"), ("64:ff9b::a9fe:a9fe", "metadata"),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffa", "private"),  # Teredo, client 10.0.0.5
    # bracketed, as a URL writes IPv6
    ("[fd00:ec2::254]", "metadata"), ("[::1]", "loopback"),
]

ALLOWED_IPS = [
    "198.18.0.7", "198.19.255.254",  # RFC 2544 benchmarking: the mock cloud's public range
    "203.0.113.7", "195.26.233.3", "8.8.8.8", "1.1.1.1",
    "100.63.255.255", "100.128.0.1",  # just outside CGNAT
    "172.15.255.255", "172.32.0.1", "169.255.0.1", "192.0.0.193",
    "2001:db8::1", "2606:4700::1111", "::ffff:198.18.0.7", "2002:c612:7::1",
]

REFUSED_NAMES: list[tuple[str, str]] = [
    # IP literals in disguise (any spelling a resolver or URL parser takes)
    ("10.0.0.5", "ip-literal"), ("198.18.0.7", "ip-literal"), ("0x0a000005", "ip-literal"),
    ("167772165", "ip-literal"), ("10.1", "ip-literal"), ("012.0.0.5", "ip-literal"),
    ("0xa9.0xfe.0xa9.0xfe", "ip-literal"), ("[::1]", "ip-literal"), ("::1", "ip-literal"),
    ("fd00:ec2::254", "ip-literal"), ("10.0.0.5.", "ip-literal"),
    # in-cluster and site names
    ("kubernetes", "in-cluster-name"), ("web", "in-cluster-name"),
    ("web.default.svc", "in-cluster-name"), ("kubernetes.default.svc.cluster.local",
                                              "in-cluster-name"),
    ("web.default.svc.cluster.local.", "in-cluster-name"), ("cluster.local", "in-cluster-name"),
    ("10-0-0-5.default.pod.cluster.local", "in-cluster-name"), ("WEB.Default.SVC",
                                                                 "in-cluster-name"),
    ("printer.local", "in-cluster-name"), ("db.corp.internal", "in-cluster-name"),
    ("nas.home.arpa", "in-cluster-name"), ("box.localdomain", "in-cluster-name"),
    # loopback and metadata names
    ("localhost", "loopback"), ("LOCALHOST.", "loopback"), ("app.localhost", "loopback"),
    ("metadata.google.internal", "metadata"), ("metadata", "metadata"),
    ("metadata.tencentyun.com", "metadata"),
    # not a DNS name
    ("", "malformed"), ("  ", "malformed"), ("evil@10.0.0.5", "malformed"),
    ("a.example.com/path", "malformed"), ("a b.example.com", "malformed"),
    ("a.example.com:443", "malformed"), ("xn--bcher-kva.example\u00e9", "malformed"),
    ("-a.example.com", "malformed"), ("a..example.com", "malformed"),
    ("a" * 64 + ".example.com", "malformed"),
]

ALLOWED_NAMES = ["abc123-8000.proxy.runpod.net", "grape-fig-1234.salad.cloud",
                 "api.example.com", "xn--bcher-kva.example", "a1.b-2.example.org.",
                 "svc.example.com", "local.example.com", "x.y.z.example.io"]


@pytest.mark.parametrize(("host", "reason"), REFUSED_IPS)
def test_every_refused_ip_class(host: str, reason: str) -> None:
    assert refusal(host, kind="ip") == reason
    assert refusal(host) == reason  # the prober's view: judged by what it looks like
    assert reason in REASONS and describe(reason) == REASONS[reason]


@pytest.mark.parametrize("host", ALLOWED_IPS)
def test_public_and_lab_addresses_are_allowed(host: str) -> None:
    assert refusal(host, kind="ip") is None
    assert refusal(host) is None


@pytest.mark.parametrize(("host", "reason"), REFUSED_NAMES)
def test_every_refused_host_name(host: str, reason: str) -> None:
    assert refusal(host, kind="hostname") == reason


@pytest.mark.parametrize("host", ALLOWED_NAMES)
def test_public_host_names_are_allowed(host: str) -> None:
    assert refusal(host, kind="hostname") is None
    assert refusal(host) is None


def test_an_ip_entry_must_hold_an_ip_address() -> None:
    assert refusal("api.example.com", kind="ip") == "malformed"
    assert refusal("198.18.0.7 ", kind="ip") is None  # blanks around are the cloud's slack


def test_the_clusters_own_ranges_are_refused_even_where_public() -> None:
    policy = AddressPolicy.build(pod_cidrs=["198.18.128.0/17", "2001:db8:1::/48"],
                                 service_cidrs=["203.0.113.0/24"])
    assert refusal("198.18.200.1", kind="ip", policy=policy) == "pod-cidr"
    assert refusal("2001:db8:1::7", kind="ip", policy=policy) == "pod-cidr"
    assert refusal("203.0.113.9", kind="ip", policy=policy) == "service-cidr"
    assert refusal("::ffff:203.0.113.9", kind="ip", policy=policy) == "service-cidr"
    assert refusal("198.18.0.7", kind="ip", policy=policy) is None
    assert refusal("198.18.200.1", kind="ip") is None  # not without the setting


def test_trusted_ranges_allow_private_cgnat_and_ula_only() -> None:
    policy = AddressPolicy.build(
        trusted=["100.64.0.0/10", "10.8.0.0/16", "fd7a:115c:a1e0::/48", "169.254.0.0/16",
                 "127.0.0.0/8", "0.0.0.0/0"],
        service_cidrs=["10.8.128.0/17"])
    assert refusal("100.101.102.103", kind="ip", policy=policy) is None  # a Tailscale address
    assert refusal("10.8.0.9", kind="ip", policy=policy) is None
    assert refusal("fd7a:115c:a1e0::1", kind="ip", policy=policy) is None
    narrow = AddressPolicy.build(trusted=["10.8.0.0/16"])
    assert refusal("10.9.0.1", kind="ip", policy=narrow) == "private"  # outside the /16
    assert refusal("100.64.0.1", kind="ip", policy=narrow) == "cgnat"
    # 0.0.0.0/0 is listed above, yet trust never covers these classes
    assert refusal("10.8.200.1", kind="ip", policy=policy) == "service-cidr"
    assert refusal("169.254.169.254", kind="ip", policy=policy) == "metadata"
    assert refusal("100.100.100.200", kind="ip", policy=policy) == "metadata"
    assert refusal("169.254.3.4", kind="ip", policy=policy) == "link-local"
    assert refusal("127.0.0.1", kind="ip", policy=policy) == "loopback"
    assert refusal("224.0.0.1", kind="ip", policy=policy) == "multicast"
    assert refusal("10.8.0.9", kind="hostname", policy=policy) == "ip-literal"


def test_a_custom_cluster_domain() -> None:
    policy = AddressPolicy.build(cluster_domain="k8s.example.net.")
    assert refusal("web.ns.svc.k8s.example.net", kind="hostname", policy=policy) \
        == "in-cluster-name"
    assert refusal("k8s.example.net", kind="hostname", policy=policy) == "in-cluster-name"
    assert refusal("api.example.net", kind="hostname", policy=policy) is None


@pytest.mark.parametrize(("field", "value", "names"), [
    ("pod_cidrs", ["10.0.0.1/8"], "pod_cidrs"),  # host bits set: a typo
    ("service_cidrs", ["not-a-cidr"], "service_cidrs"),
    ("trusted_cidrs", ["100.64.0.0/33"], "trusted_cidrs"),
    ("cluster_domain", "bad domain", "cluster_domain"),
])
def test_settings_refuse_a_bad_range_naming_it(tmp_path: Any, field: str, value: Any,
                                                names: str) -> None:
    path = tmp_path / "vk.yaml"
    path.write_text(f"endpoints: {{{field}: {value!r}}}\n".replace("'", '"'))
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert "endpoints" in str(err.value) and names in str(err.value)


def test_settings_default_to_the_fixed_classes_only() -> None:
    policy = Settings().endpoints.policy()
    assert (policy.pod_cidrs, policy.service_cidrs, policy.trusted) == ((), (), ())
    assert policy.cluster_domain == "cluster.local"
    assert refusal("100.64.0.1", kind="ip", policy=policy) == "cgnat"  # no silent lab exception


def test_screen_keeps_order_and_says_why() -> None:
    good = PublishedPort(container_port=8000, host="198.18.0.7", port=30000, kind="ip")
    proxy = PublishedPort(container_port=8000, host="abc-8000.proxy.runpod.net", port=443,
                          kind="hostname", scheme="https")
    bad = PublishedPort(container_port=8000, host="10.0.0.5", port=30000, kind="ip")
    meta = PublishedPort(container_port=9000, host="169.254.169.254", port=80, kind="ip")
    allowed, refused = screen((bad, good, meta, proxy))
    assert allowed == (good, proxy)
    assert [(r.published, r.reason) for r in refused] == [(bad, "private"), (meta, "metadata")]
    assert screen(()) == ((), ())


def test_the_memo_is_bounded_and_per_policy() -> None:
    policy = AddressPolicy()
    for i in range(5000):
        refusal(f"198.18.{i // 256}.{i % 256}", kind="ip", policy=policy)
    assert len(policy._memo) <= 4096
    assert policy._memo is not DEFAULT_POLICY._memo  # each policy (its ranges) its own memo
    assert refusal("10.0.0.5", kind="ip", policy=policy) == "private"  # memo still answers


# ---- behind every adapter ---------------------------------------------------------------------


def _hostile_published() -> dict[str, tuple[PublishedPort, ...]]:
    """What each adapter reports from a cloud answer that names hostile addresses."""
    return {
        "mock": mock_client._published({
            "public_ip": "10.0.0.5",
            "ports": [{"container_port": 8000, "protocol": "TCP", "public_port": 30000}]}),
        "vastai": vastai._published("169.254.169.254",
                                    {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}]}),
        "salad": salad._published({"dns": "kubernetes.default.svc.cluster.local",
                                   "port": 8000}),
        "runpod": runpod._published("pod1", ["8000/tcp"],
                                    [{"private": 8000, "public": 40000, "ip": "10.0.0.5"}]),
    }


def test_what_adapters_report_from_a_hostile_cloud_is_refused_by_the_screen() -> None:
    reported = _hostile_published()
    # Vast.ai, Salad and the mock report what the cloud says (the screen refuses it, with an
    # Event); RunPod leaves out internal runtime addresses itself, with the same filter.
    assert [p.host for p in reported["mock"]] == ["10.0.0.5"]
    assert [p.host for p in reported["vastai"]] == ["169.254.169.254"]
    assert [p.host for p in reported["salad"]] == ["kubernetes.default.svc.cluster.local"]
    assert reported["runpod"] == ()
    metrics = Metrics()
    screen_ = AddressScreen(policy=AddressPolicy(), metrics=metrics)
    for provider, published in reported.items():
        instance = Instance(id=f"i-{provider}", name="n", provider=provider,
                            state=InstanceState.RUNNING, published=published)
        screened = screen_.screen(uid=f"u-{provider}", provider=provider, instance=instance)
        assert screened.published == (), provider
    for provider, reason in (("mock", "private"), ("vastai", "metadata"),
                             ("salad", "in-cluster-name")):
        assert metrics.registry.get_sample_value(
            "vkprovider_endpoints_refused_total",
            {"provider": provider, "reason": reason}) == 1, provider


def test_the_screen_counts_and_tells_once_per_pod_and_address() -> None:
    metrics = Metrics()
    s = AddressScreen(policy=AddressPolicy(), metrics=metrics)
    good = PublishedPort(container_port=8000, host="198.18.0.7", port=30000, kind="ip")
    bad = (PublishedPort(container_port=8000, host="10.0.0.5", port=30000, kind="ip"),
           PublishedPort(container_port=9000, host="10.0.0.5", port=30001, kind="ip"))
    inst = Instance(id="i-1", name="n", provider="mock", state=InstanceState.RUNNING,
                    published=(*bad, good))
    clean = Instance(id="i-2", name="m", provider="mock", state=InstanceState.RUNNING,
                     published=(good,))
    assert s.screen(uid="u2", provider="mock", instance=clean) is clean  # nothing refused
    for _ in range(3):  # three sweeps
        screened = s.screen(uid="u1", provider="mock", instance=inst)
        assert screened.published == (good,)
        assert (screened.id, screened.state) == (inst.id, inst.state)
    [message] = s.untold("u1")
    assert s.untold("u1") == []
    assert "10.0.0.5:30000" in message and "private (RFC 1918)" in message
    assert "mock" in message and "i-1" in message and "8000/TCP" in message
    sample = {"provider": "mock", "reason": "private"}
    assert metrics.registry.get_sample_value("vkprovider_endpoints_refused_total", sample) == 1
    s.keep_only(["u2"])  # the pod went away; a new pod at the same address is told again
    s.screen(uid="u1", provider="mock", instance=inst)
    assert len(s.untold("u1")) == 1
    assert metrics.registry.get_sample_value("vkprovider_endpoints_refused_total", sample) == 2


def test_ipv6_addresses_are_bracketed_in_the_message() -> None:
    s = AddressScreen(policy=AddressPolicy(), metrics=Metrics())
    inst = Instance(id="i-1", name="n", provider="p", state=InstanceState.RUNNING,
                    published=(PublishedPort(container_port=80, host="fd00:ec2::254", port=80,
                                             kind="ip"),))
    s.screen(uid="u", provider="p", instance=inst)
    [message] = s.untold("u")
    assert "[fd00:ec2::254]:80" in message and "metadata" in message
    assert cast(Any, s)._seen  # remembered until forgotten
    s.forget("u")
    assert not cast(Any, s)._seen


def test_an_instance_listed_as_before_is_not_screened_again() -> None:
    s = AddressScreen(policy=AddressPolicy(), metrics=Metrics())
    bad = PublishedPort(container_port=8000, host="10.0.0.5", port=30000, kind="ip")
    inst = Instance(id="i-1", name="n", provider="mock", state=InstanceState.RUNNING,
                    published=(bad,))
    first = s.screen(uid="u", provider="mock", instance=inst)
    assert s.screen(uid="u", provider="mock", instance=inst) is first  # the same record
    moved = Instance(id="i-1", name="n", provider="mock", state=InstanceState.RUNNING,
                     published=(PublishedPort(container_port=8000, host="192.168.0.9",
                                              port=30000, kind="ip"),))
    assert s.screen(uid="u", provider="mock", instance=moved).published == ()
    assert len(s.untold("u")) == 2, "a new address is told too"
    s.keep_only([])
    assert not cast(Any, s)._last


def test_a_clean_instance_leaves_no_entry_and_passes_by_identity() -> None:
    s = AddressScreen(policy=AddressPolicy(), metrics=Metrics())
    good = Instance(id="i-1", name="n", provider="mock", state=InstanceState.RUNNING,
                    published=(PublishedPort(container_port=80, host="198.18.0.9", port=80,
                                             kind="ip"),))
    screened = s.screen(uid="u", provider="mock", instance=good)
    assert screened is good and not cast(Any, s)._last, "a clean pod keeps nothing here"
    assert AddressScreen.passed(instance=good, screened=screened)
    bad = Instance(id="i-2", name="n", provider="mock", state=InstanceState.RUNNING,
                   published=(PublishedPort(container_port=80, host="10.0.0.5", port=80,
                                            kind="ip"),))
    refused = s.screen(uid="v", provider="mock", instance=bad)
    assert not AddressScreen.passed(instance=bad, screened=refused)
    assert AddressScreen.passed(instance=bad, screened=None) is False


class FixedListCloud:
    """A cloud whose list hands back the same Instance objects every time (as the adapters'
    list cache does while nothing changed)."""

    name = "mock"

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances

    async def list(self) -> list[Instance]:
        return list(self.instances)

    async def aclose(self) -> None:
        return None


async def test_a_sweep_screens_a_clean_instance_once_and_a_refused_one_from_its_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def inst(uid: str, host: str) -> Instance:
        return Instance(id=f"i-{uid}", name=uid, provider="mock", state=InstanceState.RUNNING,
                        tags={TAG_UID: uid, TAG_NODE: Settings().node.name},
                        published=(PublishedPort(container_port=80, host=host, port=80,
                                                 kind="ip"),))

    cloud = FixedListCloud([inst("clean", "198.18.0.9"), inst("dirty", "10.0.0.5")])
    ctl = PodController(client=cast(Any, None), settings=Settings(),
                        providers={"mock": cast(Provider, cloud)},
                        events=cast(Any, None), refs=cast(Any, None), metrics=Metrics())
    calls: list[str] = []
    real = addressscreen.screen

    def counting(published: Any, *, policy: AddressPolicy) -> Any:
        calls.append(published[0].host)
        return real(published, policy=policy)

    monkeypatch.setattr(addressscreen, "screen", counting)
    records = []
    for _ in range(3):
        results = await ctl.lister.round([("mock", cast(Provider, cloud))])
        async with ctl.providers_lock:
            podsweep.apply_lists(ctl, results, served=["mock"])
        records.append((ctl.placed.get("clean"), ctl.placed.get("dirty")))
    clean, dirty = records[-1]
    assert clean is not None and dirty is not None
    assert clean.instance is cloud.instances[0] and dirty.instance.published == ()
    assert calls == ["198.18.0.9", "10.0.0.5"], "each screened once, on its first sweep"
    assert records[1] == records[2] and records[1][0] is records[2][0], "listed as before"
    assert set(cast(Any, ctl.addresses)._last) == {"dirty"}
    await ctl.aclose()
