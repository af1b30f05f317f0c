"""Prometheus metrics of the companion (overflow admission and move-back).

Why it exists: platform teams alert on failed moves and on replicas dipping during a move; the
companion runs in its own process, so it has its own registry and port. Every replica serves it,
a standby too: ``vkprovider_companion_leader`` says which one acts, and the decision and move
figures only move on that one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vkprovider.metrics import process_collector


class CompanionMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        process_collector(r)
        self.leader = Gauge(
            "vkprovider_companion_leader",
            "1 on the companion replica that acts (the leader, or the only replica without "
            "leader election), 0 on a standby.", registry=r)
        self.admissions = Counter("vkprovider_overflow_decisions_total",
                                  "Overflow admission decisions by policy and decision.",
                                  ["policy", "decision"], registry=r)
        self.moves = Counter("vkprovider_moveback_moves_total",
                             "Move-back attempts by result (moved, rolled-back).", ["result"],
                             registry=r)
        self.move_seconds = Histogram("vkprovider_moveback_duration_seconds",
                                      "From recording the intent to the cloud replica gone.",
                                      buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1200),
                                      registry=r)
        self.min_ready_ratio = Gauge(
            "vkprovider_moveback_min_ready_ratio",
            "Lowest ready/desired replicas seen during the last move (below 1 means a dip); 1 "
            "before the first move, so a standby or a fresh leader never reads as a dip.",
            registry=r)
        self.min_ready_ratio.set(1.0)
        self.skipped = Counter("vkprovider_moveback_skipped_total",
                               "Pods on the virtual node not moved back, by reason.", ["reason"],
                               registry=r)
        self.in_flight = Gauge("vkprovider_moveback_in_flight", "Moves in progress.", registry=r)
        self.held = Counter(
            "vkprovider_moveback_held_total",
            "Moves held back although GPUs looked free, by reason: kueue (a queued or admitted "
            "gang will take them), unhealthy (only on unhealthy nodes), headroom (the policy's "
            "moveBack.headroomGPUs); counted once per change of reason per Deployment.",
            ["reason"], registry=r)
        self.preemption_fast_path = Counter(
            "vkprovider_preemption_fast_path_admissions",
            "Replacements of replicas the scheduler preempted, admitted to overflow without "
            "waiting overflowAfter.", registry=r)
        # hot-swap: cloud replicas whose GPU ran hot, or whose interruptible instance the cloud
        # will reclaim, replaced (descheduler/hotswap.py)
        self.hot_replacements = Counter(
            "vkprovider_hot_replacements",
            "Make-before-break replacements of cloud replicas, by result (replaced, rolled-back) "
            "and trigger (hot-gpu, interruption).",
            ["result", "trigger"], registry=r)
        # pre-warm, the Kueue admission check (descheduler/prewarm.py)
        self.prewarm_checks = Counter(
            "vkprovider_prewarm_checks",
            "Pre-warm admission check outcomes by result: ready, not-needed, timed-out, retry, "
            "dry-run.", ["result"], registry=r)
        self.prewarm_seconds = Histogram(
            "vkprovider_prewarm_duration_seconds",
            "From recording a pre-warm surge to its replicas Ready (the delay added to the "
            "gang's admission).", buckets=(5, 10, 20, 30, 60, 120, 300, 600), registry=r)
        self.prewarm_surge_replicas = Gauge(
            "vkprovider_prewarm_surge_replicas",
            "Replicas surged onto the virtual node by pre-warms in flight.", registry=r)
