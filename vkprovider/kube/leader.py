"""Lease-based leader election, as client-go does it, for running two replicas safely.

Why it exists: a virtual kubelet or companion with two replicas must have exactly one actor, or
two processes create instances for the same pod. Rules (client-go's, for the same reasons):

* a replica becomes leader by creating the Lease, or by taking it over once the holder has not
  renewed it for ``lease_duration`` as observed on OUR clock (never comparing the holder's
  ``renewTime`` to our clock: clocks skew);
* writes carry the Lease's resourceVersion, so two candidates cannot both win a takeover;
* the leader renews every ``retry_period``; if it cannot renew within ``renew_deadline`` it stops
  leading, and the caller must stop acting at once (here: the process exits and restarts), well
  before another replica can take over (``renew_deadline < lease_duration``). A leader that lost
  the Lease leaves without a word to the API server: the link that just failed its renewals
  would only hold it up (a release over it waits for its own deadline, past the moment a
  standby takes over), and the Lease is no longer its own to release. Only a clean stop hands
  the Lease over;
* every attempt runs under a deadline, as client-go runs each renewal under a context with the
  renew deadline: a partitioned connection (TCP open, nothing answers) must not keep a leader
  waiting on its renewal while a standby takes over. A renewal attempt is cut off
  ``renew_deadline`` after the start of the last successful one, and the leader then steps down;
  an acquire attempt gets ``renew_deadline`` too. "Renewed at" is when the successful attempt
  STARTED: the API server wrote the Lease no earlier than that, and a standby counts
  ``lease_duration`` from when it saw the write, so the leader always steps down first. Timeouts
  run on the event loop's clock, so ``clock`` must advance like real monotonic time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from vkprovider.errors import VKError
from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import format_micro_time

log = logging.getLogger(__name__)


class LeadershipLost(VKError):
    """This replica could not renew its Lease in time and must stop acting."""


class AttemptTimedOut(VKError):
    """An acquire/renew attempt had no answer before its deadline (e.g. a partitioned link)."""


class LeaderElector:
    def __init__(
        self,
        *,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0  # clock() at the start of the last successful attempt
        self.is_leader = False

    def _spec(self, *, transitions: int, acquire: str | None = None) -> dict[str, Any]:
        now = format_micro_time(datetime.now(UTC))
        return {"holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": acquire or now, "renewTime": now,
                "leaseTransitions": transitions}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the Lease afterwards."""
        try:
            lease = await self.client.get(self.path)
        except NotFoundError:
            try:
                await self.client.create(self.collection, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name}, "spec": self._spec(transitions=0)})
            except ConflictError:
                return False
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()
        expired = self.clock() - self._observed_at >= float(
            spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self.identity:
            transitions += 1
            acquire = None
        else:
            acquire = spec.get("acquireTime")
        body = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": self._spec(transitions=transitions, acquire=acquire)}
        try:
            await self.client.patch(self.path, body)
        except ConflictError:
            return False
        return True

    async def _attempt(self, *, deadline: float) -> bool:
        """:meth:`try_acquire_or_renew`, cut off at ``deadline`` (on ``clock``).

        True if we hold the Lease; then its start is the new "renewed at". A call that has no
        answer by the deadline raises :class:`AttemptTimedOut`, whatever the HTTP client's own
        timeouts and retries would have done.
        """
        started = self.clock()
        budget = deadline - started
        if budget <= 0:
            raise AttemptTimedOut("no time left before the renew deadline")
        scope = asyncio.timeout(budget)
        try:
            async with scope:
                held = await self.try_acquire_or_renew()
        except TimeoutError as exc:
            if not scope.expired():
                raise
            raise AttemptTimedOut(f"no answer from the API server within {budget:.3f}s") from exc
        if held:
            self._renewed_at = started
        return held

    @contextlib.asynccontextmanager
    async def leading(self) -> AsyncIterator[asyncio.Event]:
        """Wait until leader; yield an Event that is set if leadership is lost.

        The Event is set (and :attr:`is_leader` cleared) no later than ``renew_deadline`` after
        the start of the last successful renewal, even if the API server never answers. Leaving
        the context releases the Lease only if it was not lost: after a loss it returns at once,
        with no request.
        """
        while True:
            try:
                if await self._attempt(deadline=self.clock() + self.renew_deadline):
                    break
            except (APIError, AttemptTimedOut) as exc:
                log.warning("leader election attempt failed", extra=kv(error=str(exc)))
            await asyncio.sleep(self.retry_period)
        self.is_leader = True
        log.info("became leader", extra=kv(lease=self.name, identity=self.identity))
        lost = asyncio.Event()
        renewer = asyncio.get_running_loop().create_task(self._renew(lost))
        try:
            yield lost
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            self.is_leader = False
            log.info("stopped leading", extra=kv(lease=self.name, identity=self.identity,
                                                 lost=lost.is_set()))
            if not lost.is_set():
                await self._release()

    async def _renew(self, lost: asyncio.Event) -> None:
        try:
            await self._renew_until_lost()
        except Exception:
            log.exception("lease renewer failed; stepping down",
                          extra=kv(lease=self.name, identity=self.identity))
        # Whatever ended renewals (the deadline, or a bug), the caller must stop acting. (Not
        # reached when the caller cancels us on its way out of leading().)
        self.is_leader = False
        lost.set()

    async def _renew_until_lost(self) -> None:
        while True:
            deadline = self._renewed_at + self.renew_deadline
            await asyncio.sleep(min(self.retry_period, max(0.0, deadline - self.clock())))
            try:
                if await self._attempt(deadline=deadline):
                    continue
            except (APIError, AttemptTimedOut) as exc:
                log.warning("lease renewal failed", extra=kv(error=str(exc)))
            if self.clock() >= deadline:
                log.error("leadership lost", extra=kv(
                    lease=self.name, identity=self.identity, renew_deadline=self.renew_deadline,
                    since_renewal=round(self.clock() - self._renewed_at, 3)))
                return

    async def _release(self) -> None:
        """Hand over at once on a clean shutdown (client-go's ReleaseOnCancel); never after a
        loss (:meth:`leading`).

        Bounded by ``renew_deadline``: a leader stopped cleanly over a link that died meanwhile
        must not hang here.
        """
        with contextlib.suppress(APIError, TimeoutError):
            async with asyncio.timeout(self.renew_deadline):
                lease = await self.client.get(self.path)
                if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    await self.client.patch(self.path, {
                        "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                        "spec": {"holderIdentity": None, "leaseDurationSeconds": 1}})
