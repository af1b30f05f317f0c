"""The mock adapter sends a registry credential only with images of its registry, and the mock
cloud records what each create carried (never the password), so tests can assert on both."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from providers.base import TAG_UID, InstanceSpec, RegistryAuth
from providers.mock import ManualClock, MockCloudState, MockProvider, create_app
from providers.options import InvalidOption
from tests.fakes.common import assert_never_shown

BASE_URL = "http://mock.test"
PASSWORD = "org-Registry-pw-93c1"


@pytest.fixture
def cloud() -> MockCloudState:
    clock = ManualClock()
    return MockCloudState(clock=clock, sleep=clock.sleep,
                          start_time=datetime(2025, 1, 1, tzinfo=UTC))


def provider(state: MockCloudState, **options: object) -> MockProvider:
    return MockProvider(name="mock", base_url=BASE_URL, owner="vk-node",
                        transport=httpx.ASGITransport(app=create_app(state=state)),
                        **options)  # type: ignore[arg-type]


def spec(uid: str, image: str, auth: RegistryAuth | None = None) -> InstanceSpec:
    return InstanceSpec(name=f"vk-node-{uid}", image=image, gpu_type="H100", gpu_count=1,
                        tags={TAG_UID: uid}, registry_auth=auth)


def carried(state: MockCloudState) -> dict[str, object]:
    return {e["uid"]: e["registry_auth"] for e in state.ledger()["instances"]}


async def test_a_node_wide_credential_goes_only_with_images_of_its_registry_hosts(
        cloud: MockCloudState) -> None:
    cloud.set_private_registry("registry.example.com", username="org", password=PASSWORD)
    mock = provider(cloud, registry_auth={"username": "org", "password": PASSWORD},
                    registry_hosts=["registry.example.com"])
    await mock.create(spec("u1", "attacker.example/x:1"))
    await mock.create(spec("u2", "registry.example.com/team/model:1"))
    await mock.create(spec("u3", "busybox"))
    assert carried(cloud) == {
        "u1": None,
        "u2": {"registry": "registry.example.com", "username": "org"},
        "u3": None,
    }
    assert_never_shown(PASSWORD, mock, cloud.ledger())
    await mock.aclose()


async def test_a_pod_credential_goes_only_with_an_image_of_its_registry(
        cloud: MockCloudState) -> None:
    mock = provider(cloud)
    auth = RegistryAuth(registry="registry.example.com", username="team", password=PASSWORD)
    await mock.create(spec("u1", "attacker.example/x:1", auth))
    await mock.create(spec("u2", "registry.example.com/team/model:1", auth))
    assert carried(cloud) == {
        "u1": None, "u2": {"registry": "registry.example.com", "username": "team"}}
    await mock.aclose()


@pytest.mark.parametrize("options", [
    {"registry_auth": {"username": "org", "password": PASSWORD}},
    {"registry_hosts": ["registry.example.com"]},
    {"registry_auth": {"username": "org"}, "registry_hosts": ["registry.example.com"]},
    {"registry_auth": {"username": "org", "password": PASSWORD, "x": 1},
     "registry_hosts": ["registry.example.com"]},
])
def test_a_node_wide_credential_needs_both_halves(cloud: MockCloudState,
                                                  options: dict[str, object]) -> None:
    with pytest.raises(InvalidOption) as info:
        provider(cloud, **options)
    assert PASSWORD not in str(info.value)
