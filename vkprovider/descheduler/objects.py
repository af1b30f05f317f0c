"""Names and paths of the objects the companion's loops act on, written once.

Why it exists: move-back, pre-warm and the hot-replica swap all scale Deployments (or their
HPAs) and record Events on them; each had its own copy of how a Deployment's API path, its
event reference and its ``namespace/name`` key are spelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["deployment_path", "deployment_ref", "hpa_path", "object_key", "pod_ref"]


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``."""
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def deployment_path(dep: Mapping[str, Any]) -> str:
    return (f"/apis/apps/v1/namespaces/{dep['metadata']['namespace']}/deployments/"
            f"{dep['metadata']['name']}")


def hpa_path(hpa: Mapping[str, Any]) -> str:
    return (f"/apis/autoscaling/v2/namespaces/{hpa['metadata']['namespace']}/"
            f"horizontalpodautoscalers/{hpa['metadata']['name']}")


def deployment_ref(dep: Mapping[str, Any]) -> dict[str, Any]:
    """The object an Event about ``dep`` names."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": dep["metadata"]}


def pod_ref(pod: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}
