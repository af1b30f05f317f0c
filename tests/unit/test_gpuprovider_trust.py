"""A GPUProvider is not a way to read Secrets or to reach inside the cluster (registry.py).

Pure rules, no cluster: which ``credentialsSecret`` namespaces and which ``spec.endpoint`` hosts
this process trusts, and that every refusal names its field. The e2e test
(tests/e2e/test_gpuprovider_trust.py) shows the same refusals on a real control plane, with no
Secret read and no request sent.
"""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider.config import GPUProviderSourceSettings, load_settings
from vkprovider.errors import ConfigError
from vkprovider.placement import policy as pol
from vkprovider.registry import (
    REASON_ENDPOINT,
    REASON_SECRET_NAMESPACE,
    endpoint_refusal,
    trust_problems,
)

OWN = "vkprovider-system"


def spec(**fields: Any) -> pol.GPUProviderSpec:
    return pol.parse_gpu_provider({"metadata": {"name": "p"}, "spec": fields}).spec


def key(namespace: str = OWN) -> dict[str, str]:
    return {"namespace": namespace, "name": "cloud-key"}


def problems(s: pol.GPUProviderSpec, **settings: Any) -> list[tuple[str, str]]:
    found = trust_problems(spec=s, own_namespace=OWN,
                           settings=GPUProviderSourceSettings(**settings))
    return [(p.field, p.reason) for p in found]


def test_a_secret_in_the_providers_own_namespace_and_the_clouds_own_api_is_trusted() -> None:
    for type_ in ("runpod", "vastai", "salad"):
        assert problems(spec(type=type_, credentialsSecret=key())) == []
    assert problems(spec(type="runpod", credentialsSecret=key(),
                         endpoint="https://api.runpod.io/graphql")) == []
    assert problems(spec(type="runpod", credentialsSecret=key(),
                         endpoint="https://API.RunPod.io.")) == []


def test_a_secret_in_another_namespace_is_refused_naming_the_field() -> None:
    s = spec(type="runpod", credentialsSecret=key("team-a"))
    assert problems(s) == [("spec.credentialsSecret.namespace", REASON_SECRET_NAMESPACE)]
    [found] = trust_problems(spec=s, own_namespace=OWN, settings=GPUProviderSourceSettings())
    assert "team-a" in found.message and OWN in found.message
    # the operator may list more namespaces
    assert problems(s, secret_namespaces=["team-a"]) == []
    assert problems(spec(type="mock", endpoint="http://127.0.0.1:9", credentialsSecret=key("x")),
                    allowed_endpoint_hosts=["127.0.0.1"]) == [
        ("spec.credentialsSecret.namespace", REASON_SECRET_NAMESPACE)]


@pytest.mark.parametrize("endpoint", [
    "https://10.0.0.1",                         # a private address
    "https://10.0.0.1:443/v1",
    "http://kubernetes.default.svc",            # http, and in-cluster
    "https://kubernetes.default.svc",           # an in-cluster name
    "https://kubernetes.default.svc.cluster.local:443",
    "https://kubernetes",                       # a name with no dot
    "https://localhost:8443",
    "https://127.0.0.1",
    "https://2130706433",                       # 127.0.0.1, as the resolver reads it
    "https://0x7f.1",
    "https://[::1]:443",
    "https://[::ffff:10.0.0.1]",
    "https://169.254.169.254/latest/meta-data",  # cloud metadata
    "https://metadata.google.internal",
    "https://192.168.1.10",
    "https://100.64.0.1",                       # carrier-grade NAT: not global
    "https://evil.example.com",                 # public, but not the cloud's API host
    "https://api.runpod.io.evil.example.com",
    "https://user@api.runpod.io",               # user information: refused outright
    "https://evil.example.com\\@api.runpod.io",
    "https://api.runpod.io%2eevil.example.com",
    "http://api.runpod.io",                     # the right host, but not https
])
def test_a_real_clouds_endpoint_must_be_its_own_api_over_https(endpoint: str) -> None:
    s = spec(type="runpod", credentialsSecret=key(), endpoint=endpoint)
    assert problems(s) == [("spec.endpoint", REASON_ENDPOINT)]


def test_the_refusal_says_why_and_how_to_allow_it() -> None:
    def why(endpoint: str) -> str:
        s = spec(type="runpod", credentialsSecret=key(), endpoint=endpoint)
        return endpoint_refusal(spec=s, allowed_hosts=()) or ""

    assert "private address" in why("https://10.0.0.1")
    assert "inside the cluster" in why("https://kubernetes.default.svc")
    assert "only https" in why("http://kubernetes.default.svc")
    assert "link-local" in why("https://169.254.169.254")
    assert "loopback" in why("https://2130706433")
    assert "not the runpod API host (api.runpod.io)" in why("https://evil.example.com")
    assert "allowed_endpoint_hosts" in why("https://10.0.0.1")


def test_a_listed_host_is_allowed_private_and_plain_http_included() -> None:
    s = spec(type="runpod", credentialsSecret=key(), endpoint="http://127.0.0.1:8080/graphql")
    assert problems(s, allowed_endpoint_hosts=["127.0.0.1"]) == []
    assert problems(spec(type="salad", credentialsSecret=key(), endpoint="https://[::1]:9"),
                    allowed_endpoint_hosts=["[::1]"]) == []
    assert problems(spec(type="vastai", credentialsSecret=key(),
                         endpoint="https://Proxy.Corp.example"),
                    allowed_endpoint_hosts=["proxy.corp.example"]) == []
    # listing one host allows that host only
    assert problems(spec(type="runpod", credentialsSecret=key(), endpoint="https://10.0.0.2"),
                    allowed_endpoint_hosts=["10.0.0.1"]) == [("spec.endpoint", REASON_ENDPOINT)]


def test_a_mock_endpoint_is_free_until_it_would_receive_a_key() -> None:
    assert problems(spec(type="mock", endpoint="http://127.0.0.1:9000")) == []
    assert problems(spec(type="mock", endpoint="http://mock-cloud.vkprovider-system.svc")) == []
    # never the metadata service, key or not
    assert problems(spec(type="mock", endpoint="http://169.254.169.254")) == [
        ("spec.endpoint", REASON_ENDPOINT)]
    # a Secret of our own namespace (say the RunPod key) is never sent to an unlisted host
    keyed = spec(type="mock", endpoint="https://evil.example.com", credentialsSecret=key())
    assert problems(keyed) == [("spec.endpoint", REASON_ENDPOINT)]
    assert problems(keyed, allowed_endpoint_hosts=["evil.example.com"]) == []


def test_both_problems_are_reported_at_once() -> None:
    s = spec(type="runpod", credentialsSecret=key("kube-system"), endpoint="https://10.0.0.1")
    assert problems(s) == [("spec.credentialsSecret.namespace", REASON_SECRET_NAMESPACE),
                           ("spec.endpoint", REASON_ENDPOINT)]


def test_the_settings_refuse_what_could_never_match(tmp_path: Any) -> None:
    s = GPUProviderSourceSettings(allowed_endpoint_hosts=["API.example.com.", "[::1]", "::0:1"])
    assert s.allowed_endpoint_hosts == ("api.example.com", "::1", "::1")
    for bad in ("https://api.example.com", "api.example.com:443", "10.0.0.1:80", "a/b", ""):
        path = tmp_path / "c.yaml"
        path.write_text(f"gpu_providers: {{allowed_endpoint_hosts: [{bad!r}]}}\n")
        with pytest.raises(ConfigError, match=r"gpu_providers\.allowed_endpoint_hosts"):
            load_settings(path)
    path = tmp_path / "n.yaml"
    path.write_text("gpu_providers: {secret_namespaces: [Team_A]}\n")
    with pytest.raises(ConfigError, match=r"gpu_providers\.secret_namespaces"):
        load_settings(path)
