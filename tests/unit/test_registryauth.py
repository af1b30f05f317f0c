"""The registry matching rule every credential passes on its way to a cloud (pure, no cluster)."""

from __future__ import annotations

import pytest

from providers.base import InstanceSpec, RegistryAuth
from providers.options import InvalidOption
from providers.registryauth import (
    RegistryScope,
    image_matches,
    keyring_location,
    node_scope,
    normalize_image,
    pod_credential,
    same_registry,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(("image", "normal"), [
    ("busybox", ("docker.io", "library/busybox")),
    ("busybox:1.36", ("docker.io", "library/busybox")),
    (f"busybox@{DIGEST}", ("docker.io", "library/busybox")),
    ("acme/app:1", ("docker.io", "acme/app")),
    ("docker.io/busybox", ("docker.io", "library/busybox")),
    ("index.docker.io/acme/app", ("docker.io", "acme/app")),
    ("registry-1.docker.io/acme/app", ("registry-1.docker.io", "acme/app")),
    ("localhost:5000/x", ("localhost:5000", "x")),
    ("localhost/x:dev", ("localhost", "x")),
    ("registry.example.com/team/model:1", ("registry.example.com", "team/model")),
    (f"registry.example.com/team/model@{DIGEST}", ("registry.example.com", "team/model")),
    (f"registry.example.com:443/team/model:1@{DIGEST}", ("registry.example.com:443",
                                                        "team/model")),
    ("REGISTRY.Example.com/team/model", ("registry.example.com", "team/model")),
    ("Registry/model", ("registry", "model")),
    ("[fd00::1]:5000/app", ("[fd00::1]:5000", "app")),
])
def test_images_are_normalized(image: str, normal: tuple[str, str]) -> None:
    assert normalize_image(image) == normal


@pytest.mark.parametrize("image", [
    "", " ", " ghcr.io/acme/app", "ghcr.io/acme/app ", "https://ghcr.io/acme/app",
    "ghcr.io/Acme/app", "registry.example.com@attacker.example/x", "ghcr.io//app",
    "ghcr.io/acme/app:", "ghcr.io/acme/app@sha256:abc", "ghcr.io/acme/app\n",
])
def test_what_is_not_an_image_reference_normalizes_to_none(image: str) -> None:
    assert normalize_image(image) is None
    assert not image_matches("ghcr.io", image)
    assert not image_matches("*", image)


@pytest.mark.parametrize("location", [
    "docker.io", "index.docker.io", "registry-1.docker.io", "https://index.docker.io/v1/",
    "DOCKER.IO",
])
@pytest.mark.parametrize("image", [
    "busybox", "acme/app:1", "docker.io/acme/app", "index.docker.io/acme/app",
    "registry-1.docker.io/acme/app",
])
def test_docker_hubs_names_are_one_registry(location: str, image: str) -> None:
    assert image_matches(location, image)


@pytest.mark.parametrize("location", ["docker.io", "index.docker.io", "registry-1.docker.io"])
def test_docker_hub_is_not_every_registry(location: str) -> None:
    assert not image_matches(location, "ghcr.io/acme/app")
    assert not image_matches(location, "localhost:5000/x")
    assert not image_matches(location, "docker.io.attacker.example/x")
    assert not image_matches(location, "docker.io:5000/x")


def test_ports_must_be_equal() -> None:
    assert image_matches("localhost:5000", "localhost:5000/x")
    assert not image_matches("localhost:5000", "localhost/x")
    assert not image_matches("localhost", "localhost:5000/x")
    assert not image_matches("localhost:5000", "localhost:5001/x")
    assert not image_matches("registry.example.com", "registry.example.com:443/team/model")


def test_a_path_is_a_prefix_of_the_image_path() -> None:
    assert image_matches("registry.example.com/team", "registry.example.com/team/model:1")
    assert not image_matches("registry.example.com/team", "registry.example.com/other/model")
    # a string prefix, as in the kubelet; a trailing slash keeps it to the folder
    assert image_matches("registry.example.com/team", "registry.example.com/team-b/model")
    assert not image_matches("registry.example.com/team/", "registry.example.com/team-b/model")
    assert image_matches("registry.example.com/team/", "registry.example.com/team/model")
    assert image_matches("docker.io/library", "busybox")


def test_wildcards_match_one_host_part() -> None:
    assert image_matches("*.example.com", "eu.example.com/model")
    assert not image_matches("*.example.com", "a.eu.example.com/model")
    assert not image_matches("*.example.com", "example.com/model")
    assert not image_matches("*.example.com", "eu.example.com.attacker.example/model")
    assert not image_matches("*.example.com", "eu.example.com:5000/model")
    assert image_matches("*.example.com:5000", "eu.example.com:5000/model")
    assert image_matches("reg-[0-9].example.com", "reg-7.example.com/x")
    assert not image_matches("reg-[0-9].example.com", "reg-77.example.com/x")
    assert not image_matches("[.example.com", "[.example.com/x")  # a bad glob matches nothing


def test_hosts_compare_without_case() -> None:
    assert image_matches("Registry.Example.COM", "registry.example.com/team/model")
    assert image_matches("registry.example.com", "REGISTRY.example.com/team/model")
    assert image_matches("*.EXAMPLE.com", "eu.example.COM/team/model")


def test_tags_and_digests_take_no_part() -> None:
    for image in ("registry.example.com/team/model:1", f"registry.example.com/team/model@{DIGEST}",
                  f"registry.example.com/team/model:1@{DIGEST}"):
        assert image_matches("registry.example.com/team/model", image), image
        assert not image_matches("attacker.example", image), image


def test_locations_drop_scheme_and_api_version() -> None:
    assert keyring_location("https://index.docker.io/v1/") == "index.docker.io"
    assert keyring_location("http://registry.example.com:5000/v2/team") == (
        "registry.example.com:5000/team")
    assert keyring_location("registry.example.com/") == "registry.example.com"
    assert keyring_location("https://") is None
    assert keyring_location("/team") is None


# -- node-wide credentials: registry_hosts ----------------------------------------------------


def test_a_scope_covers_only_its_registries() -> None:
    scope = RegistryScope.of(["registry.example.com", "*.corp.example:5000/ml/"])
    assert scope.covers("registry.example.com/team/model:1")
    assert scope.covers("eu.corp.example:5000/ml/model")
    assert not scope.covers("attacker.example/x:1")
    assert not scope.covers("eu.corp.example/ml/model")
    assert not scope.covers("eu.corp.example:5000/other/model")
    assert not scope.covers("busybox")


def test_node_scope_needs_registry_hosts_with_a_credential() -> None:
    assert node_scope({}, credential="registry_id") is None
    with pytest.raises(InvalidOption, match=r"options\.registry_hosts: required with registry_id"):
        node_scope({"registry_id": "reg-1"}, credential="registry_id")
    with pytest.raises(InvalidOption, match="registry_id is not"):
        node_scope({"registry_hosts": ["ghcr.io"]}, credential="registry_id")
    scope = node_scope({"registry_id": "reg-1", "registry_hosts": ["ghcr.io/acme"]},
                       credential="registry_id")
    assert scope == RegistryScope(("ghcr.io/acme",))
    assert node_scope({"registry_id": "reg-1", "registry_hosts": "ghcr.io"},
                      credential="registry_id") == RegistryScope(("ghcr.io",))


@pytest.mark.parametrize("hosts", [[], [""], ["https://"], ["/team"], ["[.example.com"], [3],
                                   {"a": "b"}, ["ghcr..io"]])
def test_bad_registry_hosts_are_refused(hosts: object) -> None:
    with pytest.raises(InvalidOption, match=r"options\.registry_hosts"):
        node_scope({"registry_id": "reg-1", "registry_hosts": hosts}, credential="registry_id")


def test_a_default_scope_from_a_credential_never_quotes_it() -> None:
    assert node_scope({"image_login": "x"}, credential="image_login",
                      default=["ghcr.io"]) == RegistryScope(("ghcr.io",))
    with pytest.raises(InvalidOption) as info:
        node_scope({"image_login": "x"}, credential="image_login", default=["/s3cret-pw"])
    assert "s3cret" not in str(info.value)


# -- a pod's credential ------------------------------------------------------------------------


def test_same_registry() -> None:
    assert same_registry("docker.io", "busybox")
    assert same_registry("registry-1.docker.io", "acme/app")
    assert same_registry("Registry.Example.com", "registry.example.com/team/model:1")
    assert same_registry("localhost:5000", "localhost:5000/x")
    assert not same_registry("localhost", "localhost:5000/x")
    assert not same_registry("registry.example.com", "attacker.example/x:1")
    assert not same_registry("*.example.com", "eu.example.com/x")  # a registry, not a glob
    assert not same_registry("registry.example.com/team", "registry.example.com/team/x")


def test_a_pod_credential_goes_only_with_an_image_of_its_registry() -> None:
    auth = RegistryAuth(registry="registry.example.com", username="org", password="pw-123456")
    ours = InstanceSpec(name="n", image="registry.example.com/team/model:1", gpu_count=1,
                        registry_auth=auth)
    theirs = InstanceSpec(name="n", image="attacker.example/x:1", gpu_count=1,
                          registry_auth=auth)
    assert pod_credential(ours) is auth
    assert pod_credential(theirs) is None
    assert pod_credential(InstanceSpec(name="n", image="busybox", gpu_count=1)) is None
