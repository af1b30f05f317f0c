"""Every example in manifests/examples is something vkprovider accepts, not just valid YAML.

A GPUProvider example is built into its adapter exactly as `vkprovider run` builds one from a
GPUProvider object (vkprovider.registry.build_from_spec, after the same parse as the provider
source), with a fake API key and no network: an option the adapter does not know, or a value it
refuses, fails here with the adapter's own message. The OverflowPolicies name only example
providers, and the mock example points at the Service that manifests/mock-cloud creates.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from providers.base import Provider
from vkprovider.placement.policy import (
    GPUProvider,
    parse_gpu_provider,
    parse_overflow_policy,
)
from vkprovider.registry import build_from_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
MOCK_COMPONENT = REPO / "manifests" / "mock-cloud"


def examples(kind: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj.get("kind") == kind:
                found.append((path.name, obj))
    return found


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Building an adapter must not call its cloud: any connection attempt fails the test."""

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"an adapter connected to {address} while being built")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield


def test_examples_cover_every_file() -> None:
    kinds = {name: obj["kind"] for name, obj in
             examples("GPUProvider") + examples("OverflowPolicy")}
    assert sorted(kinds) == sorted(p.name for p in EXAMPLES.glob("*.yaml")), (
        "an example of another kind: teach this test to check it")


@pytest.mark.parametrize(("name", "obj"), examples("GPUProvider"),
                         ids=[n for n, _ in examples("GPUProvider")])
async def test_gpuprovider_example_builds_its_adapter(name: str, obj: dict[str, Any],
                                                      no_network: None) -> None:
    provider: GPUProvider = parse_gpu_provider(obj)
    adapter: Provider = build_from_spec(name=provider.name, spec=provider.spec,
                                        api_key="fake-key-for-tests", owner="vk-examples",
                                        timeout=5.0)
    try:
        assert adapter.name == provider.name
    finally:
        await adapter.aclose()


def test_policies_name_example_providers() -> None:
    providers = {obj["metadata"]["name"] for _, obj in examples("GPUProvider")}
    for name, obj in examples("OverflowPolicy"):
        policy = parse_overflow_policy(obj)
        missing = set(policy.spec.providers) - providers
        assert not missing, f"{name} names providers with no example: {sorted(missing)}"


def test_mock_example_points_at_the_mock_cloud_component() -> None:
    ((_, mock),) = [(n, o) for n, o in examples("GPUProvider") if o["spec"]["type"] == "mock"]
    objs = [o for o in yaml.safe_load_all((MOCK_COMPONENT / "mock-cloud.yaml").read_text()) if o]
    (service,) = [o for o in objs if o["kind"] == "Service"]
    meta = service["metadata"]
    port = service["spec"]["ports"][0]["port"]
    url = urlsplit(mock["spec"]["endpoint"])
    assert (url.hostname, url.port) == (f"{meta['name']}.{meta['namespace']}.svc", port)
