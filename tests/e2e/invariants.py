"""The chaos suite's invariants, read from the mock cloud's ledger and the API server.

Shared by every chaos test so that each profile is judged by the same rules:
* never two live instances for one pod UID at any moment (``overlapping_live_instances``);
* the spend the provider counted (``vkprovider_spend_dollars_total``, persisted in its Lease)
  equals the ledger's, within the documented bound (``check_spend``).
"""

from __future__ import annotations

import collections
import itertools
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.node.spend import SPEND_ANNOTATION, decode, spend_lease_path
from vkprovider.testing.waiting import eventually

#: Per instance, how much of its end the provider may miss: the sweep interval in these tests is
#: 1 s; under fault profiles a sweep's list can fail (5xx, a 429 burst) and the next one counts.
END_SLACK_SECONDS = 6.0


def _t(value: str | None) -> float:
    return math.inf if value is None else datetime.fromisoformat(value).timestamp()


def overlapping_live_instances(ledger: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(uid, id, id) for every two instances of one pod UID alive at the same moment."""
    by_uid: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for entry in ledger:
        by_uid[entry["uid"]].append(entry)
    overlaps = []
    for uid, entries in by_uid.items():
        for a, b in itertools.combinations(entries, 2):
            if max(_t(a["created_at"]), _t(b["created_at"])) < min(_t(a["stopped_at"]),
                                                                   _t(b["stopped_at"])):
                overlaps.append((uid, a["id"], b["id"]))
    return overlaps


@dataclass(frozen=True)
class SpendCheck:
    ledger: float  # the cloud's bill
    counted: float  # the provider's persisted count
    exported: float  # the provider's /metrics
    bound: float  # how far below the bill the count may be

    def __str__(self) -> str:
        short = self.ledger - self.counted
        pct = 100.0 * short / self.ledger if self.ledger else 0.0
        return (f"ledger ${self.ledger:.4f}, provider ${self.counted:.4f} "
                f"(short ${short:.4f} = {pct:.2f}%, bound ${self.bound:.4f})")


def exported_spend(metrics_text: str) -> float:
    """Sum of ``vkprovider_spend_dollars_total`` over providers in a /metrics page."""
    pattern = re.compile(r"^vkprovider_spend_dollars_total\{[^}]*\} (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(metrics_text))


async def check_spend(*, kube: KubeClient, node: str, ledger: list[dict[str, Any]],
                      total_cost: float, metrics: Any,
                      namespace: str = "vkprovider-system") -> SpendCheck:
    """Wait for the provider's record to cover the last release, then compare it to the bill.

    ``ledger`` must be final (every instance stopped); ``metrics`` is an async callable that
    returns the current leader's /metrics page.
    """
    assert all(e["stopped_at"] for e in ledger), "compare spend only once all have stopped"

    async def record() -> dict[str, Any]:
        try:
            body = await kube.get(spend_lease_path(namespace=namespace, node=node))
        except NotFoundError:
            return {}
        value = (body["metadata"].get("annotations") or {}).get(SPEND_ANNOTATION)
        return decode(value) if value else {}

    # the record is final once a sweep after the last release found nothing billing
    rec = await eventually(record, timeout=30, interval=0.5,
                           what="the provider's spend record with nothing billing",
                           until=lambda r: bool(r) and all(c.open == 0 for c in r.values()))
    counted = sum(c.dollars for c in rec.values())
    exported = exported_spend(await metrics())
    bound = sum(e["price_per_hour"] * END_SLACK_SECONDS / 3600.0
                for e in ledger if e["started_at"] is not None)
    check = SpendCheck(ledger=total_cost, counted=counted, exported=exported, bound=bound)
    assert math.isclose(exported, counted, abs_tol=1e-6), f"exported {exported} != {check}"
    # never more than the cloud billed (1e-6 per instance: the ledger rounds each entry)
    assert counted <= total_cost + 1e-6 * (len(ledger) + 1), f"counted more than billed: {check}"
    assert total_cost - counted <= bound, f"counted too little: {check}"
    return check
