"""The key a cloud's HTTPS edge gets is the key of the adapter that runs the pod.

Why it exists: SaladCloud's access domain (and the mock cloud's hostname-only mode) authenticate
with the account's API key; the probes and the traffic gateway add it. An account declared as a
GPUProvider has its key only in a Secret, read once to build its adapter and kept nowhere else,
so the key must come from that adapter, not from the settings file's ``providers:`` (which does
not name it: probes and the gateway got no key, and the edge answered 401).
"""

from __future__ import annotations

import pytest

from providers.base import edge_api_key
from vkprovider.edgekeys import EdgeKeys
from vkprovider.placement.policy import parse_gpu_provider
from vkprovider.registry import build_adapter, build_from_spec

SECRET_KEY = "from-the-secret-4c1d"  # a test value


def gpu_provider(type_: str, **options: str) -> object:
    spec = parse_gpu_provider({
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "GPUProvider",
        "metadata": {"name": "acct", "generation": 1},
        "spec": {"type": type_, "endpoint": "http://127.0.0.1:9",
                 "credentialsSecret": {"namespace": "ops", "name": "acct-key"},
                 **({"options": options} if options else {})}}).spec
    return build_from_spec(name="acct", spec=spec, api_key=SECRET_KEY, owner="node", timeout=1)


@pytest.mark.parametrize(("type_", "options"), [
    ("mock", {}), ("salad", {"organization": "org", "project": "proj"})])
async def test_an_adapter_built_from_a_gpuprovider_offers_its_key_to_the_edge(
        type_: str, options: dict[str, str]) -> None:
    adapter = gpu_provider(type_, **options)
    try:
        assert edge_api_key(adapter) == SECRET_KEY
        assert SECRET_KEY not in repr(adapter)
    finally:
        await adapter.aclose()  # type: ignore[attr-defined]


async def test_a_cloud_whose_edge_has_no_auth_offers_no_key() -> None:
    adapter = build_adapter(type_="runpod", name="rp", url="http://127.0.0.1:9", api_key="k",
                            timeout=1, options={}, owner="node", field="spec")
    try:
        assert edge_api_key(adapter) is None  # RunPod's proxy: authenticate at the server
    finally:
        await adapter.aclose()
    assert edge_api_key(object()) is None  # an adapter without the capability


async def test_edge_keys_ask_the_adapter_running_the_pod_whatever_its_source() -> None:
    from_secret = gpu_provider("mock")
    from_settings = build_adapter(type_="mock", name="cfg", url="http://127.0.0.1:9",
                                  api_key="settings-key", timeout=1, options={}, owner="node",
                                  field="providers[0]")
    keyless = build_adapter(type_="mock", name="open", url="http://127.0.0.1:9", api_key=None,
                            timeout=1, options={}, owner="node", field="providers[1]")
    adapters = {"acct": from_secret, "cfg": from_settings, "open": keyless}
    keys = EdgeKeys(settings_keys={"cfg": lambda: "settings-key", "open": lambda: None,
                                   "gone": lambda: "settings-only"})
    assert keys("acct") is None, "no adapter told yet: nothing"
    keys.adapters = adapters  # type: ignore[assignment]
    try:
        assert keys("acct") == SECRET_KEY  # a GPUProvider's account: no providers: entry
        assert keys("cfg") == "settings-key"
        assert keys("open") is None
        assert keys("gone") == "settings-only"  # no adapter: the settings file's reader
        assert keys("unknown") is None
        # a rotated Secret rebuilds the adapter in the controller's map: the new key is used
        rotated = build_adapter(type_="mock", name="acct", url="http://127.0.0.1:9",
                                api_key="rotated-key", timeout=1, options={}, owner="node",
                                field="spec")
        adapters["acct"] = rotated
        assert keys("acct") == "rotated-key"
        await rotated.aclose()  # type: ignore[attr-defined]
        assert SECRET_KEY not in repr(keys) and "settings-key" not in repr(keys)
    finally:
        for adapter in (from_secret, from_settings, keyless):
            await adapter.aclose()  # type: ignore[attr-defined]
