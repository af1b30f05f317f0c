"""Run startup, readiness and liveness probes against replicas, with the kubelet's semantics.

Why it exists: a replica is Ready when its server answers its readiness probe, not when its
instance boots; a diffusion or LLM server loads weights for minutes. The kubelet runs probes for
pods on real nodes; for cloud pods the provider must, over the network, against the address the
cloud publishes. The fake kubelet of the test harness uses the same class for internal pods, so
both sides of a move are judged by one set of rules.

Rules (as the kubelet's prober manager applies them):

* Until the startup probe succeeds, readiness and liveness do not run; ``started`` is False. A
  container with no startup probe is started as soon as it runs. Startup failing
  ``failureThreshold`` times in a row means the container must restart.
* Readiness starts False when there is a readiness probe (True without one, once started);
  ``successThreshold`` successes in a row make it True, ``failureThreshold`` failures False.
* Liveness failing ``failureThreshold`` times in a row sets ``liveness_failed``: the owner
  restarts the container and calls :meth:`Prober.track` with a new ``running_since``, which
  starts every probe of that container afresh.
* ``initialDelaySeconds`` counts from ``running_since``; then one probe per ``periodSeconds``.

Cost: one sleeping task per (replica, container, probe); at most ``max_concurrent`` probes in
flight; each probe's first run is jittered over a tenth of its period, and once it first passes
it moves to a random phase of its period, so a thousand replicas started together are probed
spread over the period, not in the same second. An HTTP probe is one short HTTP/1.1
exchange on a fresh connection (``Connection: close``, as the kubelet's prober does), read up to
the status line: a general-purpose client's pool bookkeeping cost ten times more CPU per probe
(bench/probes.py), and CPU per pod is what limits a small provider host.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from vkprovider.probing.dialing import DIRECT, Dialer, NoRoute
from vkprovider.probing.spec import ContainerProbes, Probe, parse_probes

__all__ = ["USER_AGENT", "ContainerProbeState", "ContainerProbes", "Prober", "Target",
           "parse_probes"]

log = logging.getLogger(__name__)

USER_AGENT = "kube-probe/1.37"

#: Maps a container port to where it is dialled: (host, port) or (host, port, scheme), where a
#: scheme of "https" says the cloud terminates TLS in front of the container, or (host, port,
#: scheme, edge) where edge is (header, provider): the cloud's edge wants that provider's API
#: key in that header (SaladCloud's access domain with auth on), added by the prober's
#: ``edge_key``. None: the port is not reachable (yet); the probe counts as failed.
EdgeAuth = tuple[str, str]
Target = Callable[[int], tuple[str, int] | tuple[str, int, str | None]
                  | tuple[str, int, str | None, EdgeAuth | None] | None]


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerProbeState:
    """What the probes say about one container now."""

    name: str
    started: bool
    ready: bool
    liveness_failed: bool  # startup or liveness failed past its threshold: restart it
    message: str | None = None  # the last failure, for events ("HTTP probe failed ...")
    probed: bool = False  # a readiness result exists (False: still in initial delay)


@dataclass(kw_only=True, eq=False, slots=True)
class _Container:
    spec: ContainerProbes
    state: ContainerProbeState
    started: asyncio.Event = field(default_factory=asyncio.Event)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (ok, fail) run


@dataclass(kw_only=True, eq=False, slots=True)
class _Entry:
    target: Target
    running_since: float
    containers: list[_Container]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Prober:
    """Probes replicas registered with :meth:`track` until :meth:`forget`.

    ``refuse`` (the provider passes :func:`providers.addresses.refusal`) says why a target host
    must not be dialled: such a probe fails without any connection (``probes_refused``,
    ``on_refused``). A backstop: the pod controller already screens what clouds publish. The
    fake kubelet, which probes the lab's pod IPs, passes none.
    """

    def __init__(self, *, dialer: Dialer = DIRECT, max_concurrent: int = 64,
                 on_change: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, jitter: float = 0.1,
                 refuse: Callable[[str], str | None] | None = None,
                 edge_key: Callable[[str], str | None] | None = None) -> None:
        self._dialer = dialer
        # a provider's API key for its edge's auth header (never in a message or log)
        self._edge_key = edge_key
        self._refuse = refuse
        self._sem = asyncio.Semaphore(max_concurrent)
        self.on_change = on_change
        self._clock = clock
        self._jitter = jitter
        self._entries: dict[str, _Entry] = {}
        # HTTPS probes skip verification, as the kubelet's do (the endpoint is the pod's own);
        # so no CA store is loaded either (a default context holds ~0.8 MiB of it)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE
        self.probes_run = 0
        self.probe_failures = 0
        self.probes_refused = 0  # targets ``refuse`` turned down: never dialled
        self.on_refused: Callable[[], None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def track(self, key: str, *, containers: Sequence[ContainerProbes], target: Target,
              running_since: float, assume_ready: bool = False) -> None:
        """Probe ``key``'s containers; a new ``running_since`` (a restart) starts them afresh.

        Calling again with the same ``running_since`` only updates ``target`` (a cloud may
        publish its addresses late). ``assume_ready``: the container was started and Ready
        before this process took over (a restart of the prober's owner, not of the container):
        it stays so until its probes say otherwise, as a restarted kubelet keeps a Ready pod
        Ready, so a provider restart never pulls every replica out of its Services."""
        entry = self._entries.get(key)
        if entry is not None and entry.running_since == running_since:
            entry.target = target
            return
        if entry is not None:
            self._cancel(entry)
        cs = [_Container(spec=c, state=ContainerProbeState(
            name=c.name, started=assume_ready or c.startup is None,
            ready=assume_ready or (c.startup is None and c.readiness is None),
            liveness_failed=False)) for c in containers]
        entry = _Entry(target=target, running_since=running_since, containers=cs)
        self._entries[key] = entry
        for c in cs:
            if c.state.started:
                c.started.set()
            for kind, probe in (("startup", c.spec.startup), ("readiness", c.spec.readiness),
                                ("liveness", c.spec.liveness)):
                if probe is not None:
                    entry.tasks.append(asyncio.get_running_loop().create_task(
                        self._loop(key, entry, c, kind, probe), name=f"probe-{kind}-{key}"))
        if entry is not None and any(c.state.ready or c.state.started for c in cs):
            self._changed(key)

    def forget(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._cancel(entry)

    def state(self, key: str) -> tuple[ContainerProbeState, ...] | None:
        entry = self._entries.get(key)
        return None if entry is None else tuple(c.state for c in entry.containers)

    def tracked(self, key: str) -> bool:
        return key in self._entries

    async def run(self) -> None:
        """Keep the prober alive until cancelled; closes the HTTP client on the way out."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for entry in list(self._entries.values()):
            self._cancel(entry)
        self._entries.clear()

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _cancel(entry: _Entry) -> None:
        for t in entry.tasks:
            t.cancel()
        entry.tasks.clear()

    def _changed(self, key: str) -> None:
        if self.on_change is not None:
            try:
                self.on_change(key)
            except Exception:  # the owner's bug must not stop probing
                log.exception("probe change callback failed", extra={"key": key})

    async def _loop(self, key: str, entry: _Entry, c: _Container, kind: str,
                    probe: Probe) -> None:
        if kind != "startup":
            await c.started.wait()
        first = entry.running_since + probe.initial_delay
        delay = max(0.0, first - self._clock())
        delay += random.uniform(0.0, self._jitter * probe.period) if self._jitter else 0.0
        await asyncio.sleep(delay)
        spread = bool(self._jitter)
        while True:
            ok, message = await self._run_one(entry, probe)
            if self._record(key, c, kind, probe, ok=ok, message=message):
                return  # startup succeeded (done), or failed past its threshold
            if spread and ok:
                # Once it answers, move this probe to a random phase of its period (one sleep
                # between half and one and a half periods): replicas that started together
                # (a burst, a provider restart) are then probed spread over the whole period,
                # not in the same second, which kept the event loop's lag up (bench/probes.py).
                spread = False
                await asyncio.sleep(probe.period * random.uniform(0.5, 1.5))
                continue
            await asyncio.sleep(probe.period)

    def _record(self, key: str, c: _Container, kind: str, probe: Probe, *, ok: bool,
                message: str | None) -> bool:
        """Fold one result into the state; True when this probe loop should stop."""
        good, bad = c.counts.get(kind, (0, 0))
        good, bad = (good + 1, 0) if ok else (0, bad + 1)
        c.counts[kind] = (good, bad)
        before = c.state
        state = before if ok else replace(before, message=message)
        stop = False
        if kind == "startup":
            if ok:
                state = replace(state, started=True,
                                ready=state.ready or c.spec.readiness is None)
                c.started.set()
                stop = True
            elif bad >= probe.failure_threshold:
                state = replace(state, liveness_failed=True)
                stop = True
        elif kind == "readiness":
            state = replace(state, probed=True)
            if ok and good >= probe.success_threshold:
                state = replace(state, ready=True)
            elif not ok and bad >= probe.failure_threshold:
                state = replace(state, ready=False)
        elif not ok and bad >= probe.failure_threshold:
            state = replace(state, liveness_failed=True)
            stop = True
        c.state = state
        if (state.started, state.ready, state.liveness_failed) != (
                before.started, before.ready, before.liveness_failed):
            self._changed(key)
        return stop

    async def _run_one(self, entry: _Entry, probe: Probe) -> tuple[bool, str | None]:
        target = entry.target(probe.port)
        if target is None:
            return False, f"port {probe.port} is not published (yet)"
        host, port = target[0], target[1]
        tls = len(target) > 2 and target[2] == "https"
        edge = target[3] if len(target) > 3 else None
        why = self._refuse(host) if self._refuse is not None else None
        if why is not None:  # never dialled: an untrusted address (providers/addresses.py)
            self.probes_refused += 1
            if self.on_refused is not None:
                self.on_refused()
            return False, f"probe target {host}:{port} refused: {why}"
        async with self._sem:
            self.probes_run += 1
            if probe.action == "http":
                return await self._http(host, port, probe, tls=tls,
                                        edge=self._edge_header(edge))
            return await self._tcp(host, port, probe)  # grpc: a TCP connect (module docstring)

    async def _connect(self, host: str, port: int, *, tls: bool
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        real_host, real_port = self._dialer.resolve(host, port)
        if tls:
            return await asyncio.open_connection(real_host, real_port, ssl=self._tls,
                                                 server_hostname=host)
        return await asyncio.open_connection(real_host, real_port)

    def _edge_header(self, edge: EdgeAuth | None) -> tuple[str, str] | None:
        if edge is None or self._edge_key is None:
            return None
        key = self._edge_key(edge[1])
        return (edge[0].lower(), key) if key else None

    async def _http(self, host: str, port: int, probe: Probe, *, tls: bool,
                    edge: tuple[str, str] | None = None) -> tuple[bool, str | None]:
        https = tls or probe.scheme == "HTTPS"
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = f"{'https' if https else 'http'}://{netloc}{probe.path}"
        headers = {"host": probe.host_header or netloc, "user-agent": USER_AGENT,
                   "accept": "*/*"}
        for name, value in probe.headers:
            headers[name.lower()] = value
        if edge is not None:  # the edge's key wins over a pod author's header of that name
            headers[edge[0]] = edge[1]
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if "\n" not in k + v)
        request = f"GET {probe.path} HTTP/1.1\r\n{head}connection: close\r\n\r\n".encode()
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(probe.timeout):
                reader, writer = await self._connect(host, port, tls=https)
                writer.write(request)
                line = await reader.readline()
        except TimeoutError:
            self.probe_failures += 1
            return False, (f"Get \"{url}\": context deadline exceeded "
                           f"(timeout {probe.timeout:g}s)")
        except NoRoute:
            self.probe_failures += 1
            return False, f"Get \"{url}\": no route to host"
        except (OSError, ssl.SSLError) as e:
            self.probe_failures += 1
            return False, f"Get \"{url}\": {type(e).__name__}"
        finally:
            if writer is not None:
                writer.close()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            self.probe_failures += 1
            return False, f"Get \"{url}\": malformed HTTP response"
        status = int(parts[1])
        if 200 <= status < 400:
            return True, None
        self.probe_failures += 1
        return False, f"HTTP probe failed with statuscode: {status}"

    async def _tcp(self, host: str, port: int, probe: Probe) -> tuple[bool, str | None]:
        try:
            async with asyncio.timeout(probe.timeout):
                _, writer = await self._connect(host, port, tls=False)
            writer.close()
        except NoRoute:
            self.probe_failures += 1
            return False, f"dial tcp {host}:{port}: no route to host"
        except (OSError, TimeoutError) as e:
            self.probe_failures += 1
            return False, f"dial tcp {host}:{port}: {type(e).__name__}"
        return True, None
