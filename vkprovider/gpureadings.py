"""A pod's GPU figures as read from its cloud: the readings and how a cloud's answer is parsed.

Why it exists: the readings are shared by the kubelet API (``api/gpu.py`` collects them on a
timer and serves them at ``/stats/summary`` and ``/metrics/resource``) and the pod engine
(``node/gpuhealth.py`` acts on a GPU that runs too hot). The engine must not depend on the
kubelet API's HTTP face, so the data and its parser live here, below both: plain values, no I/O,
importing nothing else of vkprovider (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GPUReading", "PodGPUs", "parse_readings"]


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUReading:
    index: int
    uuid: str
    model: str
    utilization: float | None  # 0-1
    tensor_active: float | None  # 0-1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_celsius: float | None
    power_watts: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PodGPUs:
    """The latest figures of one pod's instance."""

    uid: str
    namespace: str
    pod: str
    provider: str
    instance_id: str
    at: float  # wall time (epoch seconds) of the reading
    gpus: tuple[GPUReading, ...]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _ratio(value: Any, *, percent: bool) -> float | None:
    number = _num(value)
    if number is None:
        return None
    if percent:
        number /= 100.0
    return min(1.0, max(0.0, number))


def parse_readings(body: Mapping[str, Any], *, default_model: str) -> tuple[GPUReading, ...]:
    """The per-GPU figures of a ``gpu_metrics`` answer; malformed entries are skipped."""
    out: list[GPUReading] = []
    raw = body.get("gpus")
    if not isinstance(raw, list):
        return ()
    for position, item in enumerate(raw):
        if not isinstance(item, Mapping):
            continue
        index = item.get("index", position)
        index = index if isinstance(index, int) and not isinstance(index, bool) else position
        used, total = _num(item.get("memory_used_bytes")), _num(item.get("memory_total_bytes"))
        out.append(GPUReading(
            index=index,
            uuid=str(item.get("uuid") or f"gpu-{index}"),
            model=str(item.get("gpu_type") or default_model or "unknown"),
            utilization=_ratio(item.get("gpu_utilization"), percent=True),
            tensor_active=_ratio(item.get("tensor_active"), percent=False),
            memory_used_bytes=None if used is None else int(used),
            memory_total_bytes=None if total is None else int(total),
            temperature_celsius=_num(item.get("temperature_c")),
            power_watts=_num(item.get("power_w")),
        ))
    return tuple(out)
