"""Blocked offers and providers, each with an expiry.

Why it exists: after a capacity error, asking the same (provider, region, GPU type) again for every
pod wastes the create deadline and hammers the cloud; after an auth error, every call to that
provider will fail until someone fixes the credentials. Blocks expire on their own, so a cloud
that regains capacity is used again without anyone intervening.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

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
