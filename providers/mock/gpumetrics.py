"""The GPU figures of a mock instance (utilization, memory, temperature, power).

Why it exists: the provider's metrics and descheduling policies read per-GPU figures; the mock
makes them up here, deterministically from the state's seed, the instance and a 10 s time
bucket, so a test sees the same figures on every run and a pinned load (``set_load``) shows; a
pinned temperature (``set_temperature``, a hot GPU) is reported as is while the container runs.
"""

from __future__ import annotations

import zlib
from typing import Any

from providers.mock.records import Phase, Record

__all__ = ["metrics_json"]

_GIB = 1024**3
#: GPU memory and board power by GPU type; unknown types get the defaults.
_GPU_MEMORY = {
    "H100": 80 * _GIB,
    "H200": 141 * _GIB,
    "A100": 80 * _GIB,
    "L40S": 48 * _GIB,
    "L4": 24 * _GIB,
    "A10G": 24 * _GIB,
    "RTX4090": 24 * _GIB,
    "T4": 16 * _GIB,
}
_GPU_WATTS = {
    "H100": 700.0,
    "H200": 700.0,
    "A100": 400.0,
    "L40S": 350.0,
    "L4": 72.0,
    "A10G": 150.0,
    "RTX4090": 450.0,
    "T4": 70.0,
}
_DEFAULT_MEMORY = 48 * _GIB
_DEFAULT_WATTS = 300.0
_METRICS_BUCKET_SECONDS = 10.0


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text``: the same on every run and machine. (Seeding a
    ``random.Random`` with a string hashes it with SHA-512: the mock's largest cost when the
    provider reads every instance's figures at once.)"""
    return zlib.crc32(text.encode()) / 2**32


def metrics_json(record: Record, *, now: float, seed: int, at: str | None) -> dict[str, Any]:
    """``{instance_id, state, at, gpus: [...]}`` of ``record`` at ``now`` (``at`` as ISO text);
    GPUs are idle unless the container is running."""
    running = record.phase is Phase.RUNNING and record.deleting is None
    base = record.load
    if base is None:
        base = 0.55 + 0.4 * _unit(f"{seed}:{record.id}")
    bucket = 0
    if record.started is not None:
        bucket = int((now - record.started) // _METRICS_BUCKET_SECONDS)
    memory_total = _GPU_MEMORY.get(record.gpu_type, _DEFAULT_MEMORY)
    watts = _GPU_WATTS.get(record.gpu_type, _DEFAULT_WATTS)
    gpus = []
    for index in range(record.gpu_count):
        noise = 0.06 * _unit(f"{seed}:{record.id}:{index}:{bucket}") - 0.03
        util = min(1.0, max(0.0, base + noise)) if running else 0.0
        gpus.append(
            {
                "index": index,
                "uuid": f"GPU-{record.id}-{index}",
                "gpu_type": record.gpu_type,
                "gpu_utilization": round(util * 100.0, 1),
                "tensor_active": round(util * 0.8, 3),
                "memory_used_bytes": int(memory_total * (0.05 + 0.85 * util)) if running else 0,
                "memory_total_bytes": memory_total,
                "temperature_c": (round(record.temperature, 1)
                                  if running and record.temperature is not None
                                  else round(32.0 + 48.0 * util, 1)),
                "power_w": round(watts * (0.1 + 0.9 * util), 1),
            }
        )
    state = "terminating" if record.deleting is not None else record.phase.value
    return {"instance_id": record.id, "state": state, "at": at, "gpus": gpus}
