"""Gateway benchmark (issue 38): what the traffic gateway adds to a request, in latency and CPU.

One replica process serves a small JSON answer on two listeners: plain HTTP (the direct path,
``traffic: direct`` to a cloud's IP:port) and HTTPS with a certificate for its edge name, signed
by a test CA (a hostname-only cloud's edge). The gateway is a real HAProxy
(``vkprovider.testing.haproxy``, the gateway's own configuration) programmed through its Runtime
API by the gateway's reconcile, exactly as the provider does: TLS to the edge with SNI, the
certificate verified, ``Host`` rewritten, warm connections. A load generator sends requests at a
fixed rate (open loop: each request's latency counts from when it was due, so a stall is not
hidden) over kept-alive connections, first straight to the replica, then through the gateway, at
each ``--rates`` (200 and 1,000 req/s by default), in one run.

Per path and rate: latency p50/p99, and CPU per request of the gateway (HAProxy), the replica
and the load generator (from /proc and ``os.times``). The difference (gateway - direct) is what
the gateway adds. Prints a table, writes ``gateway.json`` and ``gateway.txt`` to ``--out``
(bench/results), with the machine it ran on. Everything is on loopback: the numbers are the
gateway's own cost, without the internet between it and a cloud.

    .venv/bin/python -m bench.gateway                   # 200 and 1,000 req/s, 10 s each
    .venv/bin/python -m bench.gateway --rates 200 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine, pct, proc_usage, table

EDGE_NAME = "bench-8000.edge.bench.test"
BODY = json.dumps({"object": "list", "data": [{"id": "model", "object": "model"}]}).encode()
REQUEST = b"GET /v1/models HTTP/1.1\r\nhost: bench\r\naccept: application/json\r\n\r\n"
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
PATHS = ("direct", "gateway")


# ---- pure parts -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    """One path at one rate."""

    path: str
    rate: int
    sent: int
    failed: int
    p50_ms: float
    p99_ms: float
    gateway_us: float  # CPU per request of HAProxy (0 on the direct path)
    replica_us: float
    client_us: float
    # TLS connections HAProxy opened to the edge, in total so far (gateway rows): with warm
    # connections, about the load generator's connections, not its requests
    edge_connections: int = 0

    @property
    def total_us(self) -> float:
        return self.gateway_us + self.replica_us + self.client_us


def schedule(*, rate: float, seconds: float) -> list[float]:
    """When each request is due, in seconds from the start (open loop, evenly spaced)."""
    n = max(1, round(rate * seconds))
    return [i / rate for i in range(n)]


def summarize(*, path: str, rate: int, latencies: Sequence[float], failed: int,
              cpu: dict[str, float]) -> Row:
    """A :class:`Row` from the latencies (seconds) of the answered requests and the CPU
    seconds each process spent over the phase (``gateway``, ``replica``, ``client``)."""
    sent = len(latencies) + failed
    per = 1e6 / sent if sent else 0.0
    return Row(path=path, rate=rate, sent=sent, failed=failed,
               p50_ms=pct(list(latencies), 50) * 1000, p99_ms=pct(list(latencies), 99) * 1000,
               gateway_us=cpu.get("gateway", 0.0) * per, replica_us=cpu.get("replica", 0.0) * per,
               client_us=cpu.get("client", 0.0) * per)


def added(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Per rate: what the gateway path costs over the direct one (latency, CPU per request)."""
    by = {(r.path, r.rate): r for r in rows}
    out = []
    for rate in sorted({r.rate for r in rows}):
        d, g = by.get(("direct", rate)), by.get(("gateway", rate))
        if d is None or g is None:
            continue
        out.append({"rate": rate, "p50_ms": round(g.p50_ms - d.p50_ms, 3),
                    "p99_ms": round(g.p99_ms - d.p99_ms, 3),
                    "cpu_us_per_request": round(g.total_us - d.total_us, 1),
                    "gateway_cpu_us_per_request": round(g.gateway_us, 1)})
    return out


def render(rows: Sequence[Row], info: dict[str, Any]) -> str:
    header = ["path", "req/s", "sent", "failed", "p50 ms", "p99 ms", "CPU us/req: gateway",
              "replica", "client", "total", "edge TLS conns"]
    body = [[r.path, str(r.rate), f"{r.sent:,}", str(r.failed), f"{r.p50_ms:.2f}",
             f"{r.p99_ms:.2f}", f"{r.gateway_us:.0f}", f"{r.replica_us:.0f}",
             f"{r.client_us:.0f}", f"{r.total_us:.0f}",
             str(r.edge_connections) if r.path == "gateway" else "-"] for r in rows]
    diff = [[str(a["rate"]), f"{a['p50_ms']:+.2f}", f"{a['p99_ms']:+.2f}",
             f"{a['cpu_us_per_request']:+.0f}"] for a in added(rows)]
    return "\n".join([
        f"Machine: {info.get('cpu')}, {info.get('cores')} cores, {info.get('memory_gib')} GiB, "
        f"Python {info.get('python')}; HAProxy {info.get('haproxy', '?')}",
        "",
        table(header, body),
        "",
        "Added by the gateway (gateway - direct):",
        "",
        table(["req/s", "p50 ms", "p99 ms", "CPU us/req"], diff),
    ])


def payload(rows: Sequence[Row], info: dict[str, Any], *, seconds: float) -> dict[str, Any]:
    return {"machine": info, "seconds_per_phase": seconds,
            "rows": [{**asdict(r), "total_us": r.total_us} for r in rows],
            "added": added(rows)}


# ---- the replica (a process of its own, so its CPU is its own) --------------------------------


class _Replica(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            self.buffer = self.buffer[end + 4:]
            assert self.transport is not None
            self.transport.write(RESPONSE)


async def serve_replica(cert: str, key: str) -> None:
    """Serve on a plain and a TLS listener; print ``<plain port> <tls port>``; run until
    stdin closes."""
    loop = asyncio.get_running_loop()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    tls.set_alpn_protocols(["http/1.1"])
    plain = await loop.create_server(_Replica, "127.0.0.1", 0, backlog=1024)
    secure = await loop.create_server(_Replica, "127.0.0.1", 0, ssl=tls, backlog=1024)
    print(plain.sockets[0].getsockname()[1], secure.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)


# ---- the load generator -----------------------------------------------------------------------


class _Pool:
    """Up to ``size`` kept-alive connections to one ``host:port`` (as a client's pool): a new one
    while fewer are open, else a request waits for an idle one (its latency still counts from
    when it was due)."""

    def __init__(self, port: int, *, size: int) -> None:
        self.port = port
        self.size = size
        self.idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue())
        self.opened = 0

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.idle.empty() and self.opened < self.size:
            self.opened += 1
            try:
                return await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.opened -= 1
                raise
        return await self.idle.get()

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        """Give a connection back (None: it broke, a new one may be opened)."""
        if conn is None:
            self.opened -= 1
        else:
            self.idle.put_nowait(conn)

    def close(self) -> None:
        while not self.idle.empty():
            self.idle.get_nowait()[1].close()


async def _one(pool: _Pool) -> bool:
    try:
        reader, writer = await pool.get()
    except OSError:
        return False
    try:
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        pool.put(None)
        return False
    except asyncio.CancelledError:  # timed out mid-answer: the connection is unusable
        writer.close()
        pool.put(None)
        raise
    pool.put((reader, writer))
    return head.startswith(b"HTTP/1.1 200")


async def load(*, port: int, rate: int, seconds: float, connections: int
               ) -> tuple[list[float], int]:
    """Send at ``rate`` for ``seconds`` over at most ``connections`` kept-alive connections;
    the latencies of answered requests and the failures."""
    pool = _Pool(port, size=connections)
    latencies: list[float] = []
    failed = 0

    async def fire(due: float) -> None:
        nonlocal failed
        try:
            ok = await asyncio.wait_for(_one(pool), 30)
        except TimeoutError:
            ok = False
        if ok:
            latencies.append(time.perf_counter() - due)
        else:
            failed += 1

    # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds
    start = time.perf_counter() + 0.05
    tasks = []
    for offset in schedule(rate=rate, seconds=seconds):
        due = start + offset
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(fire(due)))
    await asyncio.gather(*tasks)
    pool.close()
    return latencies, failed


# ---- the run ------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> list[Row]:
    from vkprovider.gateway.plan import EdgeTarget, Planner
    from vkprovider.gateway.reconcile import Programmed, reconcile
    from vkprovider.testing.haproxy import HAProxyProcess
    from vkprovider.testing.pki import CertificateAuthority

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    (work / "ca").mkdir()
    ca = CertificateAuthority(directory=work / "ca", name="bench-edge-ca")
    pair = ca.issue(stem="edge", common_name=f"*.{EDGE_NAME.split('.', 1)[1]}", server=True,
                    hosts=(f"*.{EDGE_NAME.split('.', 1)[1]}",))
    replica = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.gateway", "--replica", str(pair.cert), str(pair.key),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    gateway = HAProxyProcess(work_dir=work / "gw", ca_file=ca.cert_path, count=1)
    try:
        assert replica.stdout is not None
        plain_port, tls_port = (int(p) for p in (await replica.stdout.readline()).split())
        await gateway.start()
        assert gateway.proc is not None
        planner = Planner(first_port=gateway.layout.first_port, count=1)
        routes, _ = planner.plan([EdgeTarget(pod_uid="bench", container_port=8000,
                                             host=EDGE_NAME, port=443, dial_host="127.0.0.1",
                                             dial_port=tls_port)])
        route = routes[("bench", 8000)]
        await reconcile(client=gateway.client, layout=gateway.layout,
                        desired=[Programmed(route=route)])
        ports = {"direct": plain_port, "gateway": route.port}
        rows = []
        for rate in args.rates:
            for path in PATHS:
                await load(port=ports[path], rate=rate, seconds=1.0,
                           connections=args.connections)  # warm: connections, TLS
                before = _cpu(gateway.proc.pid, replica.pid)
                latencies, failed = await load(port=ports[path], rate=rate,
                                               seconds=args.seconds,
                                               connections=args.connections)
                after = _cpu(gateway.proc.pid, replica.pid)
                cpu = {k: after[k] - before[k] for k in after}
                if path == "direct":
                    cpu["gateway"] = 0.0  # idle HAProxy's own ticks are not the direct path's
                rows.append(summarize(path=path, rate=rate, latencies=latencies,
                                      failed=failed, cpu=cpu))
                if path == "gateway":
                    rows[-1] = replace(rows[-1], edge_connections=await _edge_connections(
                        gateway.client, route.backend))
                r = rows[-1]
                print(f"{path} at {rate} req/s: {r.sent} sent, {r.failed} failed, "
                      f"p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms", file=sys.stderr)
        return rows
    finally:
        gateway.stop()
        if replica.stdin is not None:
            replica.stdin.close()
        await asyncio.wait_for(replica.wait(), 10)


async def _edge_connections(client: Any, backend: str) -> int:
    """Connections HAProxy opened to the edge (``show stat``'s ``connect`` of the server)."""
    text = await client.command("show stat")
    lines = text.splitlines()
    header = lines[0].lstrip("# ").split(",")
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND"):
            return int(row.get("connect") or 0)
    return 0


def _cpu(gateway_pid: int, replica_pid: int) -> dict[str, float]:
    t = os.times()
    return {"gateway": proc_usage(gateway_pid)[1], "replica": proc_usage(replica_pid)[1],
            "client": t.user + t.system}


def _haproxy_version() -> str:
    try:
        out = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, check=False)
    except OSError:
        return "?"
    first = out.stdout.split("\n", 1)[0]
    return first.split()[2] if len(first.split()) > 2 else "?"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rates", type=int, nargs="+", default=[200, 1000],
                   help="requests per second, each run on both paths (default 200 1000)")
    p.add_argument("--seconds", type=float, default=10.0, help="per path and rate (default 10)")
    p.add_argument("--connections", type=int, default=32,
                   help="the load generator's kept-alive connections per path (default 32)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--replica", nargs=2, metavar=("CERT", "KEY"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if any(r <= 0 for r in args.rates) or args.seconds <= 0 or args.connections <= 0:
        p.error("--rates, --seconds and --connections must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from vkprovider.eventloop import run as run_loop

    args = parse_args(argv)
    if args.replica:
        run_loop(serve_replica(*args.replica), choice="auto")
        return 0
    info = {**machine(), "haproxy": _haproxy_version()}
    rows = run_loop(run(args), choice="auto")
    text = render(rows, info)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gateway.json").write_text(
        json.dumps(payload(rows, info, seconds=args.seconds), indent=2, sort_keys=True) + "\n")
    (args.out / "gateway.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
