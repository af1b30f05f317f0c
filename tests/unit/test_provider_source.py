"""The e2e harness's switch that runs an older checkout's provider (docs/testing.md): what it
sets, and that a folder that is not a checkout is refused rather than silently running this
tree's code (which would make a "fails on the old provider" record a lie)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vkprovider.testing.harness import PROVIDER_SOURCE_VAR, provider_source_env


def test_unset_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDER_SOURCE_VAR, raising=False)
    assert provider_source_env() == {}


def test_a_checkout_goes_first_on_the_path_and_the_working_directory_does_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "vkprovider").mkdir()
    (tmp_path / "vkprovider" / "__init__.py").write_text("")
    monkeypatch.setenv(PROVIDER_SOURCE_VAR, str(tmp_path))
    assert provider_source_env() == {"PYTHONPATH": str(tmp_path.resolve()),
                                     "PYTHONSAFEPATH": "1"}


def test_a_folder_that_is_not_a_checkout_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv(PROVIDER_SOURCE_VAR, str(tmp_path))
    with pytest.raises(ValueError, match="not a vkprovider checkout"):
        provider_source_env()
