"""GPU health of cloud pods: a GPU that stays hot marks its pod, and its offer is avoided.

Why it exists: a cloud GPU running hot throttles (and often fails soon after), yet the cloud keeps
billing and Kubernetes sees a healthy pod. An OverflowPolicy with ``spec.gpuHealth`` sets the
limit: when a pod's hottest GPU has read above ``maxTemperatureCelsius`` for ``sustainedFor``,
this module sets the pod condition ``vkprovider.io/GPUHealthy=False`` (reason ``GPUTooHot``, the
temperature and since when in the message), records a ``GPUTooHot`` Warning Event and blocks that
offer (provider, region, GPU type) for :data:`HOT_BLOCK_SECONDS`, so a replacement is not placed on
it. The companion (descheduler/hotswap.py) replaces such a replica make-before-break. One reading
at or below the limit starts the window again and sets the condition back to ``True``.

It reads the figures the GPU collector (api/gpu.py) already keeps, so no cloud call is added.
The condition is derived from the pod's stored status each pass. A restarted provider starts with
an empty tracker, so the first time it looks at a pod it takes the stored ``False`` as its own
(:meth:`HeatTracker.seed_hot`): the pod stays marked while its GPU reads hot, and is unmarked
only by a reading at or below the limit, as if the process had never stopped. It never writes a
pod that never had the condition and is cool (no write per pod per pass).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from vkprovider.gpureadings import PodGPUs
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.podstatus_write import pod_status_path
from vkprovider.logs import kv
from vkprovider.placement.budget import pod_policy

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)

Body = dict[str, Any]

#: The pod condition type this module owns.
CONDITION = "vkprovider.io/GPUHealthy"
REASON_HOT = "GPUTooHot"
#: How long the offer of a hot instance is avoided (provider, region, GPU type).
HOT_BLOCK_SECONDS = 600.0


@dataclass(frozen=True, kw_only=True)
class Turned:
    """A pod crossed the line: ``hot`` True (above the limit for the whole window) or False."""

    uid: str
    hot: bool
    celsius: float
    since: float  # wall time the hottest GPU first read above the limit (hot), or of the reading


class HeatTracker:
    """Per pod: since when its hottest GPU reads above the limit, and whether it is hot (pure)."""

    def __init__(self) -> None:
        self._above: dict[str, float] = {}  # uid -> wall time of the first reading above
        self._hot: set[str] = set()

    def hot(self, uid: str) -> bool:
        return uid in self._hot

    def since(self, uid: str) -> float | None:
        return self._above.get(uid)

    def observe(self, uid: str, *, celsius: float | None, limit: float, sustained: float,
                at: float) -> Turned | None:
        """Take one reading (``at``: its wall time); the turn it causes, if any.

        No figure (``celsius`` None) changes nothing: a cloud that did not answer is no evidence
        either way.
        """
        if celsius is None:
            return None
        if celsius > limit:
            since = self._above.setdefault(uid, at)
            if uid not in self._hot and at - since >= sustained:
                self._hot.add(uid)
                return Turned(uid=uid, hot=True, celsius=celsius, since=since)
            return None
        self._above.pop(uid, None)
        if uid in self._hot:
            self._hot.discard(uid)
            return Turned(uid=uid, hot=False, celsius=celsius, since=at)
        return None

    def seed_hot(self, uid: str, *, since: float) -> None:
        """Take ``uid`` as hot above the limit since ``since`` (what the pod's stored condition
        says, read by a process that did not see the readings): a reading at or below the
        limit unmarks it, a hot one changes nothing. A pod already tracked is left as it is."""
        if uid in self._hot or uid in self._above:
            return
        self._above[uid] = since
        self._hot.add(uid)

    def forget(self, uid: str) -> None:
        self._above.pop(uid, None)
        self._hot.discard(uid)

    def keep_only(self, uids: Iterable[str]) -> None:
        keep = set(uids)
        for uid in [u for u in self._above if u not in keep]:
            del self._above[uid]
        self._hot &= keep


def hottest(sample: PodGPUs) -> float | None:
    temps = [g.temperature_celsius for g in sample.gpus if g.temperature_celsius is not None]
    return max(temps) if temps else None


def condition_status(pod: Mapping[str, Any]) -> str | None:
    """The pod's ``vkprovider.io/GPUHealthy`` status as stored (``"True"``, ``"False"``, None)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONDITION:
            status = c.get("status")
            return str(status) if status is not None else None
    return None


def stored_since(pod: Mapping[str, Any]) -> float | None:
    """When the pod's stored ``vkprovider.io/GPUHealthy`` condition last changed (wall time), if
    it says so in the API's format; None otherwise (the pod is any writer's: read with care)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONDITION:
            stamp = c.get("lastTransitionTime")
            try:
                when = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ")
            except ValueError:
                return None
            return when.replace(tzinfo=UTC).timestamp()
    return None


def condition(*, hot: bool, celsius: float | None, limit: int, since: float | None,
              now: datetime) -> Body:
    """The condition to write (a strategic merge patch merges conditions by type)."""
    out: Body = {"type": CONDITION, "status": "False" if hot else "True",
                 "lastProbeTime": None,
                 "lastTransitionTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if hot:
        when = datetime.fromtimestamp(since if since is not None else now.timestamp(), UTC)
        shown = "?" if celsius is None else f"{celsius:.0f}"
        out["reason"] = REASON_HOT
        out["message"] = (f"hottest GPU at {shown} °C, above {limit} °C since "
                          f"{when.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    return out


class GPUHealthWatch:
    """Reads the collector's samples every ``tick`` and acts on the pods' policies."""

    def __init__(self, *, controller: PodController, samples: Callable[[], Mapping[str, PodGPUs]],
                 samples_version: Callable[[], int] | None = None,
                 tick: float = 1.0, block_seconds: float = HOT_BLOCK_SECONDS,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.controller = controller
        self.samples = samples
        # A pass acts only on a new reading, a changed pod or a changed policy: when none of
        # the samples, the pod cache and the policy cache changed since the last pass, the
        # pass is skipped whole (at 5,000 pods, walking them every second was a fifth of the
        # provider's steady CPU). Without a version every pass walks every pod.
        self._samples_version = samples_version
        self._last_pass: tuple[int, int, int] | None = None
        self.tick = tick
        self.block_seconds = block_seconds
        self.wall = wall
        self.tracker = HeatTracker()
        self._wrote: dict[str, tuple[bool, str]] = {}  # uid -> (hot, pod resourceVersion)
        # uids this process has looked at under a gpuHealth policy: the first look takes the
        # stored condition as the tracker's start (a restart must not unmark a hot pod)
        self._looked: set[str] = set()
        # uid -> (sample time, pod resourceVersion, policy) last acted on: a pass skips pods
        # none of which changed (most of them, at every tick of a steady node)
        self._acted: dict[str, tuple[float, str, object]] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not end the watch
                log.exception("GPU health pass failed")
            await asyncio.sleep(self.tick)

    async def pass_once(self) -> None:
        c = self.controller
        seen = None
        if self._samples_version is not None:
            seen = (self._samples_version(), c.informer.changes, c.policies.changes)
            if seen == self._last_pass:
                return
        await self._walk(c)
        self._last_pass = seen  # as seen before the walk: a change during it runs the next

    async def _walk(self, c: PodController) -> None:
        samples = dict(self.samples())
        self.tracker.keep_only(samples)
        for uid in [u for u in self._wrote if u not in samples]:
            del self._wrote[uid]
        for uid in [u for u in self._acted if u not in samples]:
            del self._acted[uid]
        self._looked &= samples.keys()
        policies = c.parsed_policies()
        for uid, sample in samples.items():
            key = c.pod_keys.get(uid)
            pod = c.informer.store.get(key) if key else None
            if pod is None:
                continue
            name = pod_policy(pod)
            policy = policies.get(name) if name else None
            state = (sample.at, str(pod["metadata"].get("resourceVersion")), policy)
            if self._acted.get(uid) == state:
                continue  # the same reading, pod and policy as last pass: nothing to do
            self._acted[uid] = state
            health = policy.spec.gpu_health if policy is not None else None
            celsius = hottest(sample)
            if health is None:  # off (or the policy went): a pod marked before is unmarked
                self.tracker.forget(uid)
                if condition_status(pod) == "False" and self._wrote.get(uid, (True, ""))[0]:
                    await self._write(pod, hot=False, celsius=celsius, limit=0, since=None)
                continue
            limit = health.max_temperature_celsius
            if uid not in self._looked:
                self._looked.add(uid)
                if condition_status(pod) == "False":  # marked before this process started
                    self.tracker.seed_hot(uid, since=stored_since(pod) or sample.at)
            turned = self.tracker.observe(uid, celsius=celsius, limit=float(limit),
                                          sustained=health.sustained_for_seconds, at=sample.at)
            hot = self.tracker.hot(uid)
            stored = condition_status(pod)
            wrote = self._wrote.get(uid) == (hot, str(pod["metadata"].get("resourceVersion")))
            if not wrote and ((hot and stored != "False") or (not hot and stored == "False")):
                await self._write(pod, hot=hot, celsius=celsius, limit=limit,
                                  since=self.tracker.since(uid))
            if turned is not None and turned.hot:
                await self._turned_hot(pod, uid, turned, limit=limit)

    async def _turned_hot(self, pod: Body, uid: str, turned: Turned, *, limit: int) -> None:
        c = self.controller
        placed = c.placed.get(uid)
        since = datetime.fromtimestamp(turned.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        where = ""
        if placed is not None:
            inst = placed.instance
            c.blocks.block(provider=placed.provider, region=inst.region, gpu_type=inst.gpu_type,
                           seconds=self.block_seconds,
                           reason=f"GPU too hot on instance {inst.id}")
            where = f" on instance {inst.id} of {placed.provider}"
            if inst.region:
                where += f" ({inst.region})"
        log.warning("GPU too hot", extra=kv(pod=c.pod_keys.get(uid), celsius=turned.celsius,
                                            limit=limit, since=since))
        await c.events.emit(obj={"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]},
                            reason="GPUTooHot", type_="Warning",
                            message=f"Hottest GPU{where} at {turned.celsius:.0f} °C, above "
                                    f"{limit} °C since {since}; the offer is avoided for "
                                    f"{self.block_seconds:.0f}s")

    async def _write(self, pod: Body, *, hot: bool, celsius: float | None, limit: int,
                     since: float | None) -> None:
        meta = pod["metadata"]
        path = pod_status_path(pod)
        body = {"status": {"conditions": [condition(hot=hot, celsius=celsius, limit=limit,
                                                    since=since, now=self.wall())]}}
        try:
            await self.controller.client.patch(path, body, patch_type="strategic")
        except NotFoundError:
            return
        self.controller.metrics.kube_writes.labels("pod_status").inc()
        # Until the watch brings the new status, the stored pod still shows the old one.
        self._wrote[str(meta.get("uid"))] = (hot, str(meta.get("resourceVersion")))
