"""``pods.policy_labels``: which OverflowPolicies govern a node, checked before the API sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vkprovider.config import load_settings
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
