"""The demo story's outcome: its chapters, what it measured, and how it is told.

Why it exists apart from :mod:`vkprovider.demo`: the story's result (``StoryResult``), its tables
and the narrator are plain data and text, shared by the demo, ``bench/moveback.py``,
``bench/wayout.py`` and ``vkprovider dev up``, and unit-tested without a cluster.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vkprovider.testing.loadgen import LoadReport

#: The story's chapters, as the load generator counts them.
INSIDE, WAY_OUT, ON_CLOUD, WAY_BACK, HOME = ("inside", "way out", "on the clouds", "way back",
                                             "home")
#: How the way out plays: through Kueue with the pre-warm AdmissionCheck (judged: no failed
#: request, no dip), through Kueue without it, or by plain preemption without Kueue (both
#: measured: the baseline the pre-warm removes).
PREWARM, KUEUE, PREEMPTION = "prewarm", "kueue", "preemption"
MODES = (PREWARM, KUEUE, PREEMPTION)
MODE_TITLES = {PREWARM: "through Kueue with the pre-warm check",
               KUEUE: "through Kueue, no pre-warm check",
               PREEMPTION: "plain preemption, no Kueue"}


def may_fail(mode: str, label: str) -> bool:
    """Whether a chapter's failed requests are measured rather than judged: only the way out,
    and only without the pre-warm check."""
    return label == WAY_OUT and mode != PREWARM


class Narrator:
    def __init__(self, *, quiet: bool = False) -> None:
        self.t0 = time.monotonic()
        self.step = 0
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            sys.stdout.write(f"[{time.monotonic() - self.t0:6.1f}s] {text}\n")
            sys.stdout.flush()

    def chapter(self, text: str) -> None:
        self.step += 1
        if not self.quiet:
            sys.stdout.write(f"\n== {self.step}. {text}\n")
            sys.stdout.flush()

    async def until(self, what: str, probe: Callable[[], Awaitable[tuple[bool, str]]],
                    timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            done, progress = await probe()
            if progress != last:
                self.say(f"   {what}: {progress}")
                last = progress
            if done:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout:.0f}s ({progress})")
            await asyncio.sleep(0.25)


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("   " + line for line in lines)


@dataclass(frozen=True, kw_only=True)
class RequestChapter:
    """One chapter of the story in requests (from the load generator's report)."""

    label: str
    sent: int
    failed: int
    longest_no_endpoint: float  # seconds with no ready endpoint at all, the longest stretch
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    may_fail: bool = False  # measured, not judged (the way out without the pre-warm check)


def request_chapters(report: LoadReport, *, mode: str = PREEMPTION) -> list[RequestChapter]:
    return [RequestChapter(label=c.label, sent=c.sent, failed=c.failed,
                           longest_no_endpoint=round(c.longest_no_endpoint, 2),
                           failures_by_kind=dict(c.failures_by_kind),
                           may_fail=may_fail(mode, c.label))
            for c in report.chapters]


def requests_table(chapters: Sequence[RequestChapter]) -> str:
    rows: list[tuple[str, ...]] = [("CHAPTER", "REQUESTS SENT", "FAILED",
                                    "LONGEST NO-ENDPOINT WINDOW")]
    for c in chapters:
        rows.append((c.label, str(c.sent),
                     f"{c.failed}" if not c.may_fail else f"{c.failed} (measured: the baseline)",
                     f"{c.longest_no_endpoint:.1f} s"))
    return table(rows)


@dataclass
class WayOut:
    """The way out, measured: requests, ready replicas (sampled every 200 ms) and the gang."""

    mode: str = PREEMPTION
    fast_path: bool = True  # the companion's preemption fast path
    sent: int = 0
    failed: int = 0
    longest_no_endpoint: float = 0.0
    min_ready: int | None = None  # the Deployment's fewest readyReplicas
    seconds_below_desired: float = 0.0  # with readyReplicas below the desired count
    max_replicas: int = 0  # the Deployment's most spec.replicas (desired + surge)
    gang_admission_seconds: float | None = None  # Workload seen -> Admitted (Kueue only)
    #: QuotaReserved first seen True -> Admitted: the wait the pre-warm check adds (Kueue only)
    gang_reserved_to_admitted_seconds: float | None = None
    gang_start_seconds: float | None = None  # Job created -> every gang pod Running
    check_messages: list[str] = field(default_factory=list)  # "State: message", as they came


@dataclass
class StoryResult:
    replicas: int
    mode: str = PREEMPTION
    moved_out: int = 0
    moved_back: int = 0
    min_ready_during_moves: int | None = None
    seconds_gpus_freed_to_all_home: float = 0.0
    per_move_seconds: list[float] = field(default_factory=list)
    instances_created: int = 0
    instances_deleted: int = 0
    leaks: int = 0
    dollars: float = 0.0
    counted_dollars: float | None = None  # the provider's own count (a lower bound)
    per_cloud: dict[str, dict[str, Any]] = field(default_factory=dict)
    rate: float = 0.0  # requests per second offered through the whole story
    requests: list[RequestChapter] = field(default_factory=list)
    way_out: WayOut = field(default_factory=WayOut)
    # with a hostname-only cloud: ready Service endpoints at the gateway pod once on the clouds
    gateway_endpoints: int | None = None

    @property
    def failed_where_none_may(self) -> int:
        """Failed requests in the chapters that must fail none (all but a measured way out)."""
        return sum(c.failed for c in self.requests if not c.may_fail)

    @property
    def way_out_dipped(self) -> bool:
        """With the pre-warm check, ready replicas fell below the desired count on the way out
        (without it the dip is the measured baseline, not judged)."""
        return self.mode == PREWARM and (self.way_out.min_ready or 0) < self.replicas

    @property
    def ok(self) -> bool:
        """No leak, no dip on the way home (nor on the way out with the pre-warm check), no
        failed request where none may fail."""
        return (self.leaks == 0 and (self.min_ready_during_moves or 0) >= self.replicas
                and not self.way_out_dipped and self.failed_where_none_may == 0)


def summary_rows(result: StoryResult) -> list[tuple[str, ...]]:
    """The closing table's rows (a header first)."""
    w, r = result.way_out, result.replicas

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    fast = "" if result.mode == PREWARM else (
        ", preemption fast path " + ("on" if w.fast_path else "off"))
    rows: list[tuple[str, ...]] = [("", "VALUE")]
    rows += [("way out", MODE_TITLES[result.mode] + fast),
             ("  fewest ready replicas / seconds below desired",
              f"{w.min_ready} of {r} / {w.seconds_below_desired:.1f}"),
             ("  gang admitted after (Workload -> Admitted, s)",
              secs(w.gang_admission_seconds) if result.mode != PREEMPTION else "- (no Kueue)"),
             ("  gang running after (Job created -> all Running, s)",
              secs(w.gang_start_seconds)),
             ("inference replicas moved out / back",
              f"{result.moved_out} / {result.moved_back}"),
             ("fewest ready replicas during the moves home",
              f"{result.min_ready_during_moves} of {r}"),
             ("training done -> all home (s)", str(result.seconds_gpus_freed_to_all_home)),
             ("cloud instances created / deleted",
              f"{result.instances_created} / {result.instances_deleted}"),
             *[(f"  {k}", f"{v['created']} created, ${v['dollars']:.4f}"
                + (f", {v['requests']} requests served ({v.get('path', 'direct')})"
                   if "requests" in v else ""))
               for k, v in result.per_cloud.items()],
             ("money spent ($), the clouds' bill", f"{result.dollars:.4f}"),
             ("  as the provider counted it", "not recorded"
              if result.counted_dollars is None else f"{result.counted_dollars:.4f}"),
             ("leaks (live instances)", str(result.leaks))]
    if result.mode == PREWARM:
        rows.append(("failed requests (the way out included)", str(result.failed_where_none_may)))
    else:
        rows.append(("failed requests outside the way out", str(result.failed_where_none_may)))
    return rows
