"""One instance of the mock cloud, live or gone: its record, its lifecycle and its addresses.

Why it exists: every view of an instance (the API's JSON, logs, GPU metrics, billing, the real
listeners of its container ports) reads the same record; the lifecycle is computed from
timestamps on that record (:meth:`Record.advance`), so time moves by an injected clock and no
view needs the others.
"""

from __future__ import annotations

import enum
import ipaddress
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from providers.mock.bodies import PortBody

__all__ = [
    "PUBLIC_PORT_BASE",
    "TAG_EXIT_CODE",
    "TAG_GPU_UTILIZATION",
    "TAG_RUN_SECONDS",
    "Phase",
    "Record",
    "publish_ports",
]

TAG_RUN_SECONDS = "mock.vkprovider.io/run-seconds"
TAG_EXIT_CODE = "mock.vkprovider.io/exit-code"
TAG_GPU_UTILIZATION = "mock.vkprovider.io/gpu-utilization"

class Phase(enum.StrEnum):
    """What the container does; ``terminating`` is reported on top of it while deleting."""

    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"


#: /24 networks per public address block; 16 blocks fill 198.18.0.0/15.
PUBLIC_BLOCK_NETS = 32
PUBLIC_BLOCKS = 16
#: where every mock instance's public address is (RFC 2544's benchmarking range)
PUBLIC_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")


def is_public_address(text: str) -> bool:
    """``text`` is an address a mock cloud hands out as an instance's public one."""
    try:
        return ipaddress.ip_address(text) in PUBLIC_NETWORK
    except ValueError:
        return False


@dataclass(kw_only=True, eq=False)
class Record:
    """One instance, live or gone. Times are on the state's monotonic clock."""

    id: str
    seq: int
    name: str
    image: str
    gpu_type: str
    gpu_count: int
    region: str
    price_per_gpu_hour: float
    env_count: int  # env values are never stored
    ports: tuple[int, ...]
    published: tuple[tuple[int, str, int], ...]  # (container port, protocol, public port)
    tags: dict[str, str]
    created: float
    boot_at: float
    run_seconds: float | None
    run_exit_code: int
    load: float | None
    phase: Phase = Phase.PENDING
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    message: str | None = None
    deleting: float | None = None
    delete_done: float | None = None
    released: float | None = None
    crash_at: float | None = None  # scenario fault: fails then, if still running
    crash_message: str = ""
    crash_exit_code: int | None = None
    crashed: bool = False
    delete_fails: bool = False  # scenario fault: the pending delete comes to nothing
    public_block: int = 0  # which of the 16 public address blocks (see public_ip)
    public_host: str | None = None  # scenario fault (published_hosts): reported instead
    temperature: float | None = None  # pinned GPU temperature (admin knob), else from the load
    # The container's current run (it restarts: POST /instances/{id}/restart); ``started`` is
    # the first start (billing, logs), ``run_started`` this run's (exit, load time).
    run_started: float | None = None
    restart_count: int = 0
    load_seconds: float = 0.0  # the model server answers 503 for this long after each start
    live_ok: bool = True  # admin health knobs of the model server
    ready_ok: bool = True
    interruptible: bool = False  # rented as spot: the cloud may reclaim it
    interruption_at: float | None = None  # announced (admin) reclaim time, on the clock
    interrupted: bool = False  # reclaimed: stopped by the cloud, not by its container
    #: The pull credential the create carried, ``(registry, username)``; never its password.
    registry_auth: tuple[str, str] | None = None
    #: Requests the container's listeners served, by container port: [traffic, probes].
    served: dict[int, list[int]] = field(default_factory=dict)

    @property
    def price_per_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpu_count

    @property
    def ip(self) -> str:
        return f"100.64.{(self.seq // 254) % 256}.{self.seq % 254 + 1}"

    @property
    def public_ip(self) -> str:
        """The address the instance is reached at from outside: in 198.18.0.0/15 (RFC 2544's
        benchmarking range), apart from the pods' 100.64.x.y, one per instance. The range is
        cut in 16 blocks of 32 /24s; a cloud hands out addresses from its ``public_block`` only,
        so several mock clouds on one lab network (one address map) never share an address."""
        block = self.public_block * PUBLIC_BLOCK_NETS + (self.seq // 254) % PUBLIC_BLOCK_NETS
        return f"198.{18 + block // 256}.{block % 256}.{self.seq % 254 + 1}"

    @property
    def reported_ip(self) -> str:
        """What the cloud reports as ``public_ip`` (and routes in the address map): the
        instance's :attr:`public_ip`, or the address a scenario's ``published_hosts`` fault
        chose for it."""
        return self.public_ip if self.public_host is None else self.public_host

    def advance(self, *, now: float) -> None:
        """Apply every transition due by ``now``, at the time it was due."""
        if self.released is not None:
            return
        if self.deleting is None:
            if self.phase is Phase.PENDING and now >= self.boot_at:
                self.phase = Phase.RUNNING
                self.run_started = self.boot_at
                if self.started is None:
                    self.started = self.boot_at
            if self.phase is Phase.RUNNING and self.run_started is not None:
                exit_at = (
                    self.run_started + self.run_seconds
                    if self.run_seconds is not None
                    else math.inf
                )
                crash_at = self.crash_at if self.crash_at is not None else math.inf
                if now >= min(exit_at, crash_at):
                    if crash_at < exit_at:
                        self.crashed = True
                        self.phase = Phase.FAILED
                        self.finished = max(crash_at, self.run_started)
                        self.exit_code = self.crash_exit_code
                        self.message = self.crash_message
                    else:
                        self.phase = Phase.EXITED
                        self.finished = exit_at
                        self.exit_code = self.run_exit_code
            if (self.interruption_at is not None and now >= self.interruption_at
                    and self.phase in (Phase.PENDING, Phase.RUNNING)):
                self.phase = Phase.FAILED  # the cloud took the machine back
                self.interrupted = True
                self.finished = self.interruption_at
                self.message = INTERRUPTED_MESSAGE
        elif self.delete_done is not None and now >= self.delete_done:
            if self.delete_fails:  # the cloud dropped the delete: back to what it was
                self.deleting = self.delete_done = None
                self.delete_fails = False
                self.advance(now=now)
            else:
                self.released = self.delete_done

    def next_change(self) -> float:
        """The earliest clock time at which :meth:`advance` would change anything (``inf``:
        nothing will until someone acts on the instance)."""
        if self.released is not None:
            return math.inf
        if self.deleting is not None:
            return self.delete_done if self.delete_done is not None else math.inf
        out = math.inf
        if self.phase is Phase.PENDING:
            out = self.boot_at
        elif self.phase is Phase.RUNNING and self.run_started is not None:
            if self.run_seconds is not None:
                out = self.run_started + self.run_seconds
            if self.crash_at is not None:
                out = min(out, self.crash_at)
        if self.interruption_at is not None and self.phase in (Phase.PENDING, Phase.RUNNING):
            out = min(out, self.interruption_at)
        return out

    @property
    def serving(self) -> bool:
        """The container runs and no delete was asked for: its ports are listened on."""
        return self.phase is Phase.RUNNING and self.deleting is None and self.released is None

    def loaded_at(self) -> float | None:
        """When this run's model server has loaded (answers 200), None before it starts."""
        return None if self.run_started is None else self.run_started + self.load_seconds

    def cost(self, *, now: float) -> float:
        if self.started is None:
            return 0.0
        end = self.released if self.released is not None else now
        return self.price_per_hour * max(0.0, end - self.started) / 3600.0



#: What an instance the cloud reclaimed says (state ``failed``, ``interrupted`` true).
INTERRUPTED_MESSAGE = "interrupted: the cloud reclaimed this spot instance"


#: The first public port the mock hands out; an instance's ports count up from here.
PUBLIC_PORT_BASE = 30000


def publish_ports(ports: Iterable[PortBody]) -> tuple[tuple[int, str, int], ...]:
    """A public port for each declared (container port, protocol), in order: counting up from
    :data:`PUBLIC_PORT_BASE` and skipping the instance's own container ports, so that a public
    port never equals a container port. Deterministic: it depends on the declared ports only."""
    declared = list(dict.fromkeys((p.container_port, p.protocol) for p in ports))
    taken = {port for port, _ in declared}
    published: list[tuple[int, str, int]] = []
    public = PUBLIC_PORT_BASE
    for port, protocol in declared:
        while public in taken:
            public += 1
        published.append((port, protocol, public))
        public += 1
    return tuple(published)

