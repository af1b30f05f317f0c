"""``pods.policy_labels``: which OverflowPolicies govern a node, checked before the API sees it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vkprovider.cliflags import label_pair
from vkprovider.config import load_companion_settings, load_settings
from vkprovider.errors import ConfigError
from vkprovider.semantics.selectors import label_problem, labels_selector


def test_labels_become_one_selector_that_asks_for_all_of_them() -> None:
    assert labels_selector({"team": "ml", "example.com/track": "canary"}) == \
        "example.com/track=canary,team=ml"
    assert labels_selector({"empty-value": ""}) == "empty-value="


@pytest.mark.parametrize(("key", "value", "says"), [
    ("team a", "x", "is not a label key"),
    ("Example.com/team", "x", "prefix is not a DNS subdomain"),
    ("/team", "x", "prefix is not a DNS subdomain"),
    ("team", "a,b", "not a label value"),
    ("team", "x" * 64, "not a label value"),
    ("t" * 64, "x", "is not a label key"),
])
def test_a_malformed_label_is_named(key: str, value: str, says: str) -> None:
    assert says in (label_problem(key=key, value=value) or "")


def test_a_settings_file_with_a_bad_label_fails_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "vk.yaml"
    path.write_text('pods:\n  policy_labels:\n    "team=a": "b"\n')
    with pytest.raises(ConfigError, match=r"pods\.policy_labels.*'team=a' is not a label key"):
        load_settings(path)
    path.write_text("pods:\n  policy_labels:\n    example.com/team: ml\n")
    assert load_settings(path).pods.policy_labels == {"example.com/team": "ml"}


def test_the_companions_flag_takes_key_value_and_names_what_is_wrong() -> None:
    assert label_pair("example.com/burst-install=team-a") == ("example.com/burst-install",
                                                              "team-a")
    with pytest.raises(argparse.ArgumentTypeError, match="is not KEY=VALUE"):
        label_pair("team")
    with pytest.raises(argparse.ArgumentTypeError, match="not a label value"):
        label_pair("team=a b")
    settings = load_companion_settings(None, overrides={"policy_labels": {"team": "a"}})
    assert settings.policy_labels == {"team": "a"}
