"""Unit tests of vkprovider.node.pullsecrets: reading pull Secrets and the kubelet's keyring rules.

Why it exists: a private image pulls on a cloud only with the credential the kubelet would have
picked; these tests pin the parsing of both Secret formats and each matching rule (Docker Hub
defaults, ports, path prefixes, wildcards, most specific first, pod before ServiceAccount), and
that no error or repr shows a password.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from providers.base import RegistryAuth
from vkprovider.errors import VKError
from vkprovider.node.pullsecrets import (
    TYPE_DOCKERCFG,
    TYPE_DOCKERCONFIGJSON,
    Keyring,
    MalformedPullSecret,
    PullSecret,
    PullSecretError,
    RegistryCredential,
    normalize_image,
    parse_pull_secret,
    pull_secret_names,
    registry_auth_for_image,
)

PASSWORD = "s3cr3t-Pa55word"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def dockerconfigjson(name: str, auths: dict[str, Any], *, typed: bool = True) -> PullSecret:
    return PullSecret(name=name, data={".dockerconfigjson": json.dumps({"auths": auths})},
                      type=TYPE_DOCKERCONFIGJSON if typed else None)


def basic(user: str, password: str = PASSWORD) -> dict[str, str]:
    return {"auth": b64(f"{user}:{password}")}


def pick(image: str, *secrets: PullSecret) -> RegistryAuth | None:
    return registry_auth_for_image(image, list(secrets))


# -- reading Secrets ---------------------------------------------------------------------------


def test_dockerconfigjson_with_auth_and_with_username_password() -> None:
    secret = dockerconfigjson("regcred", {
        "https://index.docker.io/v1/": basic("hub-user"),
        "ghcr.io": {"username": "gh-user", "password": PASSWORD, "email": "a@b.c"},
    })
    creds = parse_pull_secret(secret)
    assert [(c.location, c.username, c.password, c.secret) for c in creds] == [
        ("index.docker.io", "hub-user", PASSWORD, "regcred"),
        ("ghcr.io", "gh-user", PASSWORD, "regcred"),
    ]


def test_auth_wins_over_username_and_password_and_may_be_unpadded() -> None:
    unpadded = b64("a:bc").rstrip("=")
    assert unpadded != b64("a:bc")
    secret = dockerconfigjson("s", {
        "r.io": {"auth": unpadded, "username": "ignored", "password": "ignored"}})
    (cred,) = parse_pull_secret(secret)
    assert (cred.username, cred.password) == ("a", "bc")


def test_a_password_may_hold_colons() -> None:
    (cred,) = parse_pull_secret(dockerconfigjson("s", {"r.io": basic("u", "p:a:ss")}))
    assert (cred.username, cred.password) == ("u", "p:a:ss")


def test_legacy_dockercfg() -> None:
    secret = PullSecret(name="old", type=TYPE_DOCKERCFG,
                        data={".dockercfg": json.dumps({"quay.io": basic("q")})})
    (cred,) = parse_pull_secret(secret)
    assert (cred.location, cred.username, cred.password) == ("quay.io", "q", PASSWORD)


def test_the_type_is_inferred_from_the_key_when_unknown() -> None:
    json_secret = dockerconfigjson("s", {"r.io": basic("u")}, typed=False)
    cfg_secret = PullSecret(name="c", data={".dockercfg": json.dumps({"r.io": basic("v")})})
    assert parse_pull_secret(json_secret)[0].username == "u"
    assert parse_pull_secret(cfg_secret)[0].username == "v"


@pytest.mark.parametrize("secret", [
    PullSecret(name="opaque", type="Opaque",
               data={".dockerconfigjson": json.dumps({"auths": {"r.io": basic("u")}})}),
    PullSecret(name="wrong-key", type=TYPE_DOCKERCONFIGJSON,
               data={".dockercfg": json.dumps({"r.io": basic("u")})}),
    PullSecret(name="empty", type=TYPE_DOCKERCONFIGJSON, data={".dockerconfigjson": ""}),
    PullSecret(name="no-auths", type=TYPE_DOCKERCONFIGJSON, data={".dockerconfigjson": "{}"}),
    PullSecret(name="nothing", data={"token": "x"}),
])
def test_secrets_the_kubelet_ignores_hold_no_credential(secret: PullSecret) -> None:
    assert parse_pull_secret(secret) == ()


def test_bytes_values_are_read_as_utf8() -> None:
    raw = json.dumps({"auths": {"r.io": basic("u")}}).encode()
    secret = PullSecret(name="s", type=TYPE_DOCKERCONFIGJSON, data={".dockerconfigjson": raw})
    assert parse_pull_secret(secret)[0].password == PASSWORD


@pytest.mark.parametrize(("content", "why"), [
    ('{"auths": {"r.io": {"auth": "' + PASSWORD + '"', "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"auths": ["r.io"]}', "not a map of registries"),
    ('{"auths": {"r.io": "' + PASSWORD + '"}}', "entry 1 is not an object"),
    ('{"auths": {"r.io": {"password": 12345}}}', "password is not a string"),
    ('{"auths": {"r.io": {"auth": "' + b64(PASSWORD) + '"}}}', "auth is not base64 of"),
    ('{"auths": {"r.io": {"auth": "%%' + PASSWORD + '"}}}', "auth is not base64 of"),
])
def test_unparsable_secrets_name_the_secret_and_key_never_the_content(
    content: str, why: str
) -> None:
    secret = PullSecret(name="regcred", type=TYPE_DOCKERCONFIGJSON,
                        data={".dockerconfigjson": content})
    with pytest.raises(MalformedPullSecret, match=why) as info:
        parse_pull_secret(secret)
    error = info.value
    assert isinstance(error, PullSecretError) and isinstance(error, VKError)
    assert (error.secret, error.key) == ("regcred", ".dockerconfigjson")
    assert "imagePullSecrets" in str(error) and "'regcred'" in str(error)
    for text in (str(error), repr(error), str(error.__cause__), str(error.__context__)):
        assert PASSWORD not in text and b64(PASSWORD) not in text


def test_from_object_decodes_a_secret_as_the_api_server_returns_it() -> None:
    content = json.dumps({"auths": {"r.io": basic("u")}})
    obj = {"metadata": {"name": "regcred", "namespace": "ml"}, "type": TYPE_DOCKERCONFIGJSON,
           "data": {".dockerconfigjson": b64(content)}}
    secret = PullSecret.from_object(obj)
    assert secret.name == "regcred" and secret.type == TYPE_DOCKERCONFIGJSON
    assert parse_pull_secret(secret)[0].password == PASSWORD
    with pytest.raises(MalformedPullSecret, match=r"'\.dockerconfigjson' is not base64"):
        PullSecret.from_object({**obj, "data": {".dockerconfigjson": "not base64!"}})


def test_reprs_never_show_a_password() -> None:
    secret = dockerconfigjson("s", {"r.io": basic("u")})
    (cred,) = parse_pull_secret(secret)
    auth = pick("r.io/app", secret)
    assert auth is not None
    for thing in (secret, cred, auth, Keyring([cred])):
        assert PASSWORD not in repr(thing) and PASSWORD not in str(thing)
        assert b64(f"u:{PASSWORD}") not in repr(thing)


def test_pull_secret_names_pod_first_then_service_account_without_repeats() -> None:
    pod = {"spec": {"imagePullSecrets": [{"name": "a"}, {"name": ""}, {}, {"name": "b"}]}}
    sa = {"imagePullSecrets": [{"name": "b"}, {"name": "c"}]}
    assert pull_secret_names(pod, sa) == ["a", "b", "c"]
    assert pull_secret_names(pod) == ["a", "b"]
    assert pull_secret_names({"spec": {}}, {}) == []


# -- normalizing images ------------------------------------------------------------------------


@pytest.mark.parametrize(("image", "normal"), [
    ("busybox", ("docker.io", "library/busybox")),
    ("busybox:1.36", ("docker.io", "library/busybox")),
    ("acme/app:1", ("docker.io", "acme/app")),
    ("docker.io/busybox", ("docker.io", "library/busybox")),
    ("index.docker.io/acme/app", ("docker.io", "acme/app")),
    ("ghcr.io/acme/app@sha256:" + "a" * 64, ("ghcr.io", "acme/app")),
    ("ghcr.io/acme/app:1.0@sha256:" + "a" * 64, ("ghcr.io", "acme/app")),
    ("localhost/app", ("localhost", "app")),
    ("localhost:5000/team/app:dev", ("localhost:5000", "team/app")),
    ("registry:5000/app", ("registry:5000", "app")),
    ("Registry/app", ("registry", "app")),  # a host; DNS names have no case
    ("registry-1.docker.io/acme/app", ("registry-1.docker.io", "acme/app")),
])
def test_images_are_normalized_like_the_kubelet(image: str, normal: tuple[str, str]) -> None:
    assert normalize_image(image) == normal


# -- matching ----------------------------------------------------------------------------------


@pytest.mark.parametrize("location", [
    "https://index.docker.io/v1/", "index.docker.io", "http://index.docker.io/v2/", "docker.io",
    "https://docker.io",
])
@pytest.mark.parametrize("image", ["busybox", "acme/app:1", "docker.io/acme/app",
                                   "index.docker.io/acme/app"])
def test_docker_hub_images_use_docker_hub_credentials(location: str, image: str) -> None:
    auth = pick(image, dockerconfigjson("hub", {location: basic("u")}))
    assert auth == RegistryAuth(registry="docker.io", username="u", password=PASSWORD,
                                secret="hub")


def test_registry_1_docker_io_is_docker_hub_too() -> None:
    # The kubelet treats it as an ordinary host; it is Docker Hub's registry, so the credential
    # goes to the same registry either way.
    secret = dockerconfigjson("s", {"registry-1.docker.io": basic("u")})
    assert pick("busybox", secret) is not None
    assert pick("registry-1.docker.io/acme/app", secret) is not None
    assert pick("ghcr.io/acme/app", secret) is None


def test_a_docker_hub_entry_beats_the_index_docker_io_fallback() -> None:
    fallback = dockerconfigjson("fallback", {"https://index.docker.io/v1/": basic("legacy")})
    direct = dockerconfigjson("direct", {"docker.io": basic("direct")})
    auth = pick("acme/app", fallback, direct)
    assert auth is not None and auth.username == "direct"


def test_a_credential_never_goes_with_an_image_of_another_registry() -> None:
    secret = dockerconfigjson("regcred", {"registry.example.com": basic("org")})
    assert pick("attacker.example/x:1", secret) is None
    assert pick("registry.example.com.attacker.example/x:1", secret) is None
    assert pick("attacker.example/registry.example.com/x:1", secret) is None
    assert pick("registry.example.com@attacker.example/x", secret) is None  # not a reference
    auth = pick("registry.example.com/team/model:1", secret)
    assert auth is not None and auth.registry == "registry.example.com"


def test_hosts_match_without_regard_to_case() -> None:
    secret = dockerconfigjson("s", {"Registry.Example.com": basic("u")})
    auth = pick("REGISTRY.example.COM/team/model:1", secret)
    assert auth is not None and auth.registry == "registry.example.com"


def test_docker_hub_credentials_do_not_apply_to_other_registries() -> None:
    secret = dockerconfigjson("hub", {"https://index.docker.io/v1/": basic("u")})
    assert pick("ghcr.io/acme/app", secret) is None
    assert pick("localhost:5000/app", secret) is None


def test_ports_must_be_equal() -> None:
    secret = dockerconfigjson("s", {"registry.example.com:5000": basic("u")})
    assert pick("registry.example.com:5000/app", secret) is not None
    assert pick("registry.example.com/app", secret) is None
    assert pick("registry.example.com:5001/app", secret) is None
    plain = dockerconfigjson("p", {"registry.example.com": basic("v")})
    assert pick("registry.example.com:5000/app", plain) is None


def test_a_path_is_a_prefix_of_the_image_path() -> None:
    secret = dockerconfigjson("s", {"quay.io/acme": basic("acme")})
    assert pick("quay.io/acme/app", secret) is not None
    assert pick("quay.io/other/app", secret) is None
    # A string prefix, as in the kubelet: quay.io/acme also covers quay.io/acme-labs/...
    assert pick("quay.io/acme-labs/app", secret) is not None


def test_wildcards_match_one_host_part_each() -> None:
    secret = dockerconfigjson("s", {"*.example.com": basic("w")})
    assert pick("eu.example.com/app", secret) is not None
    assert pick("a.eu.example.com/app", secret) is None
    assert pick("example.com/app", secret) is None
    assert pick("eu.example.org/app", secret) is None
    classes = dockerconfigjson("p", {"reg-[0-9].example.com": basic("q"),
                                     "x[^a-c].example.com": basic("r")})
    assert pick("reg-1.example.com/app", classes) is not None
    assert pick("reg-12.example.com/app", classes) is None
    assert pick("xd.example.com/app", classes) is not None
    assert pick("xb.example.com/app", classes) is None


def test_a_question_mark_ends_the_host_as_in_a_url() -> None:
    # Go's URL parser (and so the kubelet) reads "reg-?.example.com" as host "reg-" + a query.
    secret = dockerconfigjson("s", {"reg-?.example.com": basic("q")})
    assert pick("reg-1.example.com/app", secret) is None
    assert parse_pull_secret(secret)[0].location == "reg-"


def test_ipv6_hosts_and_user_info() -> None:
    secret = dockerconfigjson("s", {"https://[fd00::1]:5000/v2/": basic("six"),
                                    "https://someone@r.example.com/team": basic("info"),
                                    "[fd00::2]junk": basic("bad")})
    assert [c.location for c in parse_pull_secret(secret)] == [
        "[fd00::1]:5000", "r.example.com/team"]
    assert pick("[fd00::1]:5000/app", secret) is not None
    assert pick("r.example.com/team/app", secret) is not None


def test_a_malformed_glob_matches_nothing() -> None:
    secret = dockerconfigjson("s", {"[.example.com": basic("u")})
    assert pick("[.example.com/app", secret) is None


def test_the_most_specific_location_wins_across_secrets() -> None:
    broad = dockerconfigjson("broad", {"quay.io": basic("broad")})
    narrow = dockerconfigjson("narrow", {"quay.io/acme/app": basic("narrow")})
    middle = dockerconfigjson("middle", {"quay.io/acme": basic("middle")})
    auth = pick("quay.io/acme/app:1", broad, middle, narrow)
    assert auth is not None and (auth.username, auth.secret) == ("narrow", "narrow")
    auth = pick("quay.io/acme/other", broad, middle, narrow)
    assert auth is not None and auth.username == "middle"
    auth = pick("quay.io/x/y", broad, middle, narrow)
    assert auth is not None and auth.username == "broad"


def test_for_one_location_the_pods_secret_comes_before_the_service_accounts() -> None:
    pod_secret = dockerconfigjson("pod", {"ghcr.io": basic("from-pod")})
    sa_secret = dockerconfigjson("sa", {"ghcr.io": basic("from-sa")})
    auth = pick("ghcr.io/acme/app", pod_secret, sa_secret)
    assert auth is not None and (auth.username, auth.secret) == ("from-pod", "pod")
    # the ServiceAccount's, when it is more specific, still wins (one keyring, as the kubelet's)
    sa_narrow = dockerconfigjson("sa", {"ghcr.io/acme": basic("from-sa")})
    auth = pick("ghcr.io/acme/app", pod_secret, sa_narrow)
    assert auth is not None and auth.username == "from-sa"


def test_a_secret_named_twice_counts_once_where_first_given() -> None:
    first = dockerconfigjson("dup", {"ghcr.io": basic("first")})
    again = dockerconfigjson("dup", {"ghcr.io/acme": basic("again")})
    auth = pick("ghcr.io/acme/app", first, again)
    assert auth is not None and auth.username == "first"


def test_anonymous_entries_are_skipped_for_the_next_match() -> None:
    secret = dockerconfigjson("s", {"quay.io/acme": {}, "quay.io": basic("u")})
    auth = pick("quay.io/acme/app", secret)
    assert auth is not None and auth.username == "u"
    assert pick("quay.io/acme/app", dockerconfigjson("a", {"quay.io": {}})) is None


def test_lookup_lists_every_match_most_specific_first() -> None:
    creds = [RegistryCredential(location=loc, username=loc, password="p", secret="s")
             for loc in ("quay.io", "quay.io/acme", "*.io", "quay.io/acme/app")]
    assert [c.location for c in Keyring(creds).lookup("quay.io/acme/app")] == [
        "quay.io/acme/app", "quay.io/acme", "quay.io", "*.io"]


def test_no_secrets_or_no_valid_image_means_no_credential() -> None:
    assert pick("ghcr.io/acme/app") is None
    secret = dockerconfigjson("s", {"ghcr.io": basic("u")})
    for image in ("  ", " ghcr.io/acme/app", "https://ghcr.io/acme/app", "ghcr.io/Acme/app"):
        assert pick(image, secret) is None, image


def test_a_malformed_secret_fails_the_lookup() -> None:
    bad = PullSecret(name="bad", type=TYPE_DOCKERCONFIGJSON, data={".dockerconfigjson": "{"})
    with pytest.raises(MalformedPullSecret, match="Secret 'bad'"):
        pick("ghcr.io/acme/app", dockerconfigjson("ok", {"ghcr.io": basic("u")}), bad)
