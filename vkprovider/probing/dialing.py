"""Where a dial to ``host:port`` really goes: direct in production, through an address map in labs.

Why it exists: pods and cloud instances carry addresses the local machine cannot reach (pods get
100.64.x.y, mock instances 198.18.x.y; the API server refuses loopback addresses in
EndpointSlices). The test harness plays the network the way kube-proxy's DNAT would: one table
maps each virtual ``address:port`` to a real listener on loopback. Every component that dials a
replica (the provider's prober, the load generator, the fake kubelet's prober) takes a
:class:`Dialer`; production uses :data:`DIRECT`, labs an :class:`AddressMap`.

The map is a directory of JSON files, one per writer (each mock cloud, the fake kubelet), each
replaced atomically by :func:`publish_routes`. Readers merge the files and reload them when a
file changes. A virtual address with no route is unreachable (:class:`NoRoute`), as a packet to
an address nobody serves would be: it is never dialled for real.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vkprovider.errors import VKError

__all__ = ["DIRECT", "RECHECK_SECONDS", "AddressMap", "Dialer", "NoRoute", "Route",
           "publish_routes"]

#: how stale a reader's map may be: a change is seen by the first dial this long after it
RECHECK_SECONDS = 0.05


class NoRoute(VKError):
    """The address map has no route for a virtual address: the dial fails like a refused one."""

    def __init__(self, *, host: str, port: int) -> None:
        super().__init__(f"no route to {host}:{port}")
        self.host = host
        self.port = port


@dataclass(frozen=True, kw_only=True)
class Route:
    """``host:port`` (as published) is served at ``to_host:to_port`` (a real listener)."""

    host: str
    port: int
    to_host: str
    to_port: int


class Dialer(Protocol):
    """Maps the address a component wants to reach to the address it really dials."""

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        """The real ``(host, port)`` to connect to; raises :class:`NoRoute` when unreachable."""
        ...


class _Direct:
    def resolve(self, host: str, port: int) -> tuple[str, int]:
        return host, port

    def __repr__(self) -> str:
        return "DIRECT"


#: Production: dial what was asked.
DIRECT: Dialer = _Direct()


def publish_routes(*, directory: Path, owner: str, routes: Iterable[Route]) -> None:
    """Replace ``owner``'s routes in the map at ``directory`` (atomically; readers never see a
    half-written file). ``owner`` is a file-name-safe name, one per writer."""
    if not owner or "/" in owner or owner.startswith("."):
        raise ValueError(f"address map owner must be a plain file name, got {owner!r}")
    directory.mkdir(parents=True, exist_ok=True)
    body = {"routes": [{"host": r.host, "port": r.port, "to_host": r.to_host,
                        "to_port": r.to_port} for r in routes]}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, directory / f"{owner}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class AddressMap:
    """A :class:`Dialer` over an address-map directory, reloaded when a writer changes it.

    ``recheck_seconds`` bounds how often the directory is looked at (a burst of probes costs one
    ``scandir`` per interval, not one per dial). Addresses that are not virtual (loopback, or no
    route at all when ``strict`` is False) pass through unchanged.
    """

    def __init__(self, directory: Path, *, recheck_seconds: float = RECHECK_SECONDS,
                 strict: bool = True) -> None:
        self.directory = directory
        self._recheck = recheck_seconds
        self._strict = strict
        self._checked = -1e18
        self._stamp: tuple[tuple[str, int, int], ...] = ()
        self._routes: dict[tuple[str, int], tuple[str, int]] = {}

    def __repr__(self) -> str:
        return f"AddressMap({str(self.directory)!r})"

    def routes(self) -> Mapping[tuple[str, int], tuple[str, int]]:
        self._refresh()
        return dict(self._routes)

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        if host in ("127.0.0.1", "::1", "localhost"):
            return host, port
        self._refresh()
        to = self._routes.get((_bare(host), port))
        if to is None:
            if self._strict:
                raise NoRoute(host=host, port=port)
            return host, port
        return to

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self._recheck:
            return
        self._checked = now
        try:
            entries = sorted((e.name, e.stat().st_mtime_ns, e.stat().st_ino)
                             for e in os.scandir(self.directory)
                             if e.name.endswith(".json") and not e.name.startswith("."))
        except FileNotFoundError:
            entries = []
        stamp = tuple(entries)
        if stamp == self._stamp:
            return
        routes: dict[tuple[str, int], tuple[str, int]] = {}
        for name, _, _ in entries:
            try:
                body = json.loads((self.directory / name).read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue  # replaced or removed between scandir and read: next refresh sees it
            for r in body.get("routes", []):
                routes[(_bare(str(r["host"])), int(r["port"]))] = (str(r["to_host"]),
                                                                   int(r["to_port"]))
        self._routes = routes
        self._stamp = stamp


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
