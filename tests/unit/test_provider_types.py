"""A cloud type is named in five places; this keeps them from drifting apart.

Adding a type means: an adapter module, ``vkprovider/registry.py``, the ``type`` Literal of
``ProviderSettings``, ``placement.policy.ProviderType``/``PROVIDER_TYPES`` and the GPUProvider
CRD's enum (docs/writing-a-provider.md). A type missing from any one of them fails here, not in
a cluster.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider.config import ProviderSettings
from vkprovider.errors import ConfigError
from vkprovider.placement.policy import PROVIDER_TYPES, ProviderType
from vkprovider.registry import build_adapter

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "gpuproviders.yaml"


def crd_enum() -> list[str]:
    crd = yaml.safe_load(CRD.read_text())
    schema: Any = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return list(schema["properties"]["spec"]["properties"]["type"]["enum"])


def test_every_place_names_the_same_types() -> None:
    settings_types = typing.get_args(ProviderSettings.model_fields["type"].annotation)
    assert set(PROVIDER_TYPES) == set(typing.get_args(ProviderType))
    assert set(settings_types) == set(PROVIDER_TYPES)
    assert set(crd_enum()) == set(PROVIDER_TYPES)


@pytest.mark.parametrize("type_", PROVIDER_TYPES)
def test_the_registry_builds_every_type(type_: str) -> None:
    try:
        adapter = build_adapter(type_=type_, name="p", url="http://127.0.0.1:9", api_key="k",
                                timeout=1, options={}, owner="node", field="spec")
    except ConfigError as exc:  # a type may need options (Salad: organization, project)
        assert "not available" not in str(exc), exc
        return
    assert adapter.name == "p"
