"""Blocked offers and providers, each with an expiry.

Why it exists: after a capacity error, asking the same (provider, region, GPU type) again for every
pod wastes the create deadline and hammers the cloud; after an auth error, every call to that
provider will fail until someone fixes the credentials. Blocks expire on their own, so a cloud
that regains capacity is used again without anyone intervening.

Blocks survive a restart or a leader hand-over: :meth:`Blocks.snapshot` turns them into wall-clock
records (persisted by ``node/spend.py`` next to the spend record) and :meth:`Blocks.restore`
takes them back, so a new process does not ask a cloud it already knows is full.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

#: The ``gpu_type`` of a block that a pod naming no GPU type hit. It blocks only such pods: a
#: cloud with no capacity for "any GPU" at that count says nothing about a named type, and
#: ``None`` (every type) would block the whole provider.
ANY_TYPE = "*"


@dataclass(frozen=True, kw_only=True)
class Block:
    provider: str
    region: str | None  # None: every region
    gpu_type: str | None  # None: every GPU type
    until: float  # clock() value
    reason: str


class Blocks:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._blocks: dict[tuple[str, str | None, str | None], Block] = {}

    def block(
        self, *, provider: str, region: str | None, gpu_type: str | None, seconds: float,
        reason: str,
    ) -> None:
        key = (provider, region, gpu_type)
        self._blocks[key] = Block(provider=provider, region=region, gpu_type=gpu_type,
                                  until=self._clock() + seconds, reason=reason)

    def unblock_provider(self, provider: str) -> None:
        for key in [k for k in self._blocks if k[0] == provider]:
            del self._blocks[key]

    def blocked(self, *, provider: str, region: str | None, gpu_type: str | None) -> Block | None:
        """The block that applies, if any (expired ones are dropped).

        ``gpu_type`` None asks for a pod that names no type: only provider-wide blocks and
        :data:`ANY_TYPE` blocks apply to it.
        """
        now = self._clock()
        kind = gpu_type if gpu_type is not None else ANY_TYPE
        for key in ((provider, None, None), (provider, region, kind), (provider, None, kind)):
            block = self._blocks.get(key)
            if block is None:
                continue
            if block.until <= now:
                del self._blocks[key]
                continue
            return block
        return None

    def active(self) -> list[Block]:
        now = self._clock()
        return [b for b in self._blocks.values() if b.until > now]

    def snapshot(self, *, wall_now: datetime) -> list[dict[str, Any]]:
        """The active blocks as records with a wall-clock ``until`` (to the second)."""
        now = self._clock()
        out = []
        for b in sorted(self.active(), key=lambda b: (b.provider, b.region or "",
                                                      b.gpu_type or "")):
            until = wall_now + timedelta(seconds=b.until - now)
            out.append({"provider": b.provider, "region": b.region, "gpu_type": b.gpu_type,
                        "until": until.astimezone(UTC).replace(microsecond=0).isoformat(),
                        "reason": b.reason})
        return out

    def restore(self, records: Iterable[dict[str, Any]], *, wall_now: datetime) -> int:
        """Take back blocks a predecessor recorded; expired ones are dropped. Returns how many."""
        restored = 0
        for rec in records:
            left = (datetime.fromisoformat(str(rec["until"])) - wall_now).total_seconds()
            if left <= 0:
                continue
            self.block(provider=str(rec["provider"]), region=rec.get("region"),
                       gpu_type=rec.get("gpu_type"), seconds=left,
                       reason=str(rec.get("reason") or "restored"))
            restored += 1
        return restored


class BadBlocks(ValueError):
    """A persisted blocks record this version cannot read."""


def encode_blocks(records: list[dict[str, Any]]) -> str:
    return json.dumps({"v": 1, "blocks": records}, separators=(",", ":"), sort_keys=True)


def decode_blocks(value: str) -> list[dict[str, Any]]:
    """The records in ``value``; :class:`BadBlocks` naming what is wrong."""
    try:
        body: Any = json.loads(value)
    except ValueError as exc:
        raise BadBlocks(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != 1 or not isinstance(body.get("blocks"),
                                                                           list):
        raise BadBlocks("expected {\"v\": 1, \"blocks\": [...]}")
    out = []
    for i, rec in enumerate(body["blocks"]):
        try:
            if not isinstance(rec, dict):
                raise TypeError("not an object")
            str(rec["provider"])
            until = datetime.fromisoformat(str(rec["until"]))
            if until.tzinfo is None:
                raise ValueError("until needs a timezone")
        except (KeyError, TypeError, ValueError) as exc:
            raise BadBlocks(f"blocks[{i}]: {exc}") from None
        out.append(rec)
    return out
