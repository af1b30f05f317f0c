"""What each OverflowPolicy has spent, and whether one more pod fits its limits.

Why it exists: both the companion (before it admits a pod) and the virtual kubelet (before it
creates an instance, and for the node's allocatable) must count a policy's external pods, GPUs
and dollars per hour the same way. Counting is pure and works on pod dicts: a pod belongs to the
policy named in its ``vkprovider.io/overflow-policy`` annotation (written at admission); its price
is the ``vkprovider.io/price-per-hour`` annotation the provider writes after create.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vkprovider.semantics import gpus

POLICY_ANNOTATION = "vkprovider.io/overflow-policy"
PRICE_ANNOTATION = "vkprovider.io/price-per-hour"
GPU = gpus.GPU_RESOURCE
_EPSILON = 1e-9  # float dollars: 3 x $1.10 must not exceed a cap of $3.30


@dataclass(frozen=True, kw_only=True)
class Usage:
    pods: int = 0
    gpus: int = 0
    price_per_hour: float = 0.0

    def plus(self, *, gpus: int, price_per_hour: float = 0.0) -> Usage:
        return Usage(pods=self.pods + 1, gpus=self.gpus + gpus,
                     price_per_hour=self.price_per_hour + price_per_hour)


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs the pod counts against a budget: exactly what translation rents for it.

    A container whose GPU amount does not parse counts 0, so one malformed pod cannot stop a
    policy's usage from being counted.
    """
    return gpus.pod_gpus(pod, skip_invalid=True)


def pod_price(pod: Mapping[str, Any]) -> float:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(PRICE_ANNOTATION)
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        return 0.0


def pod_policy(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(POLICY_ANNOTATION)


def is_live(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not (pod.get("metadata") or {}).get(
        "deletionTimestamp")


def usage_by_policy(pods: Iterable[Mapping[str, Any]]) -> dict[str, Usage]:
    """Sum live pods per policy (pods without a policy annotation are not counted)."""
    out: dict[str, Usage] = {}
    for pod in pods:
        name = pod_policy(pod)
        if not name or not is_live(pod):
            continue
        out[name] = out.get(name, Usage()).plus(gpus=pod_gpus(pod), price_per_hour=pod_price(pod))
    return out


def budget_refusal(
    *,
    max_pods: int | None,
    max_gpus: int | None,
    max_price_per_hour: float | None,
    usage: Usage,
    gpus: int,
    expected_price_per_hour: float = 0.0,
) -> str | None:
    """Why one more pod of ``gpus`` GPUs would break a limit, or None if it fits.

    The one rule both gates apply: the companion before it admits a pod, the provider before it
    spends (node/budgetbook.py). A message starts with the name of the limit that binds.
    """
    if max_pods is not None and usage.pods + 1 > max_pods:
        return f"maxPods {max_pods} reached ({usage.pods} external pods)"
    if max_gpus is not None and usage.gpus + gpus > max_gpus:
        return f"maxGPUs {max_gpus} would be exceeded ({usage.gpus} in use + {gpus})"
    if max_price_per_hour is not None and (
        usage.price_per_hour >= max_price_per_hour - _EPSILON
        or usage.price_per_hour + expected_price_per_hour > max_price_per_hour + _EPSILON
    ):
        return (f"maxPricePerHour ${max_price_per_hour:.2f} reached "
                f"(${usage.price_per_hour:.2f}/h in use)")
    return None
