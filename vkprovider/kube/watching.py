"""List-then-watch with a local cache: the informer, done the asyncio way.

Why it exists: every controller here is level-triggered from a cache of objects it watches.
Semantics (what client-go's reflector does, what most Python clients get wrong):

* list first (paginated), then watch from the list's resourceVersion with bookmarks;
* ``410 Gone`` (as a status or an ERROR event) relists, and objects missing from the new list are
  reported as deleted, so no deletion is ever lost across a disconnect;
* a stream silent for longer than ``inactivity_timeout`` is reopened from the last resourceVersion;
* failures back off exponentially (capped), honouring ``Retry-After``; the loop never gives up.

Handlers are plain callbacks (enqueue and return): decoding and dispatch stay cheap on the loop.
Cached objects, and the objects handed to handlers, are read-only: their keys and short strings,
and with :class:`SharedSlim` whole subtrees, are shared with other cached objects.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from vkprovider.kube import codec
from vkprovider.kube.client import Body, KubeClient
from vkprovider.kube.errors import (
    APIError,
    GoneError,
    InactivityTimeout,
    NotFoundError,
    error_for,
)
from vkprovider.kube.gcpause import bulk_load
from vkprovider.kube.sharing import TreeSharer, intern_strings
from vkprovider.logs import kv

log = logging.getLogger(__name__)

Handler = Callable[[str, Body], None]
#: Work between two yields to the event loop while a relist is taken in.
_SLICE_SECONDS = 0.002
#: Objects per list page. Decoding one page holds the event loop: 500 pods took 20-25 ms, 100
#: take ~5 (bench/relist.py); more pages cost a round trip each, a millisecond here.
PAGE = 100


def object_key(obj: Body) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _without_managed_fields(obj: Body) -> Body:
    """``obj`` without managedFields (large, never read here)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _slim(obj: Body) -> Body:
    """What a cache keeps of an object: no managedFields, keys and short strings shared with
    every other cached object (kube/sharing.py)."""
    shared: Body = intern_strings(_without_managed_fields(obj))
    return shared


class SharedSlim:
    """The transform for big caches of look-alike objects (pods): like the default one, and
    equal subtrees shared across the cache through ``sharer`` (kube/sharing.py). An update
    takes over what it repeats of the cached version (:meth:`update`), so only what changed
    is walked."""

    def __init__(self, sharer: TreeSharer) -> None:
        self._sharer = sharer

    def __call__(self, obj: Body) -> Body:
        shared: Body = self._sharer(_without_managed_fields(obj))
        return shared

    def update(self, obj: Body, previous: Body) -> Body:
        shared: Body = self._sharer.update(_without_managed_fields(obj), previous)
        return shared


class Lines:
    """Splits a watch stream's bytes into its lines (one event each), without decoding them to
    text first: the JSON decoder takes the bytes as they came."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytearray]:
        """The non-empty lines ``chunk`` completes, in order; a partial last line is kept."""
        buf = self._buf
        buf += chunk
        out: list[bytearray] = []
        start = 0
        while (end := buf.find(b"\n", start)) != -1:
            if end > start:
                out.append(buf[start:end])
            start = end + 1
        del buf[:start]
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line (whitespace alone does not count)."""
        return len(self._buf.strip())


class _Pauser:
    """Yields to the event loop once :data:`_SLICE_SECONDS` of work have passed since the last
    yield (``await maybe()`` between two units of work)."""

    def __init__(self) -> None:
        self._due = time.perf_counter() + _SLICE_SECONDS

    async def maybe(self) -> None:
        if time.perf_counter() >= self._due:
            await asyncio.sleep(0)
            self._due = time.perf_counter() + _SLICE_SECONDS


class Informer:
    """Keeps ``store`` (key ``namespace/name``) in step with the API server; calls ``handler``."""

    def __init__(
        self,
        *,
        client: KubeClient,
        path: str,
        params: Mapping[str, str] | None = None,
        handler: Handler | None = None,
        name: str = "",
        inactivity_timeout: float = 70.0,
        max_backoff: float = 30.0,
        missing_ok: bool = False,
        transform: Callable[[Body], Body] | None = None,
        transform_update: Callable[[Body, Body], Body] | None = None,
    ) -> None:
        self._client = client
        self._path = path
        self._params = dict(params or {})
        self._handler = handler
        self.name = name or path
        self._inactivity = inactivity_timeout
        self._max_backoff = max_backoff
        self.store: dict[str, Body] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        #: Bumped whenever the store changes: a caller that scans the whole store can skip a
        #: scan when this (and whatever else it reads) is what it was last time.
        self.changes = 0
        self._transform = transform or _slim  # slim projections keep big caches cheap
        # an update given the cached version it replaces (SharedSlim.update)
        self._transform_update = transform_update
        self._missing_ok = missing_ok  # a 404 (CRD not installed) means "none" and retries later
        self.missing = False
        #: A 404 was seen and no answer since had anything in it (a list with items, or a watch
        #: event): the resource is being re-established, and its emptiness is not an answer.
        #: Callers that must fail closed (node/policygate.py) keep what they knew before.
        self.recovering = False

    def _emit(self, event: str, obj: Body) -> None:
        if self._handler is not None:
            try:
                self._handler(event, obj)
            except Exception:  # a handler bug must not kill the watch
                log.exception("informer handler failed", extra=kv(informer=self.name))

    async def _replace(self, items: list[Body]) -> None:
        """Make the store the list's view, telling the handler what changed.

        A relist of thousands of objects yields to the event loop every :data:`_SLICE_SECONDS`
        of work, so reconciles, Lease renewals and the kubelet API keep being served while a
        5,000-pod list is taken in (bench/relist.py: event-loop lag during a relist). A time
        budget, not a count: an object's cost varies with its size and the handler.
        """
        pause = _Pauser()
        fresh: dict[str, Body] = {}
        update = self._transform_update
        for obj in items:
            key = object_key(obj)
            previous = self.store.get(key) if update is not None else None
            fresh[key] = self._transform(obj) if previous is None or update is None \
                else update(obj, previous)
            await pause.maybe()
        for key, old in list(self.store.items()):
            new = fresh.get(key)
            if new is None or _uid(new) != _uid(old):
                del self.store[key]
                self.changes += 1
                self._emit("DELETED", old)
            await pause.maybe()
        for key, obj in fresh.items():
            existed = key in self.store
            self.store[key] = obj
            self.changes += 1
            self._emit("MODIFIED" if existed else "ADDED", obj)
            await pause.maybe()

    async def run(self) -> None:
        """Run until cancelled."""
        failures = 0
        while True:
            try:
                if not self.resource_version:
                    with bulk_load():  # no GC pauses over the decoded list (kube/gcpause.py)
                        items, rv = await self._client.list_all(self._path,
                                                                params=self._params, page=PAGE)
                        self.relists += 1
                        if items:
                            self.recovering = False
                        await self._replace(items)
                        del items
                    self.missing = False
                    self.resource_version = rv
                    self.synced.set()
                await self._watch()
                failures = 0
            except GoneError:
                log.info("watch expired; relisting", extra=kv(informer=self.name))
                self.resource_version = ""
            except NotFoundError as exc:
                if not self._missing_ok:
                    failures += 1
                    await self._backoff(exc, failures)
                    continue
                if not self.missing:
                    log.info("resource not served (CRD not installed?); treating as empty",
                             extra=kv(informer=self.name))
                self.missing = True
                self.recovering = True
                self.resource_version = ""
                await self._replace([])
                self.synced.set()
                await asyncio.sleep(self._max_backoff)
            except InactivityTimeout:
                continue
            except APIError as exc:
                failures += 1
                await self._backoff(exc, failures)

    async def _backoff(self, exc: APIError, failures: int) -> None:
        delay = exc.retry_after
        if delay is None:
            delay = min(self._max_backoff, 0.5 * 2 ** min(failures, 8))
            delay *= random.uniform(0.8, 1.2)
        log.warning("watch failed; backing off",
                    extra=kv(informer=self.name, error=str(exc), delay=round(delay, 2)))
        await asyncio.sleep(delay)

    async def _watch(self) -> None:
        params: dict[str, str | int | bool] = dict(self._params)
        params.update(
            watch=True,
            resourceVersion=self.resource_version,
            allowWatchBookmarks=True,
            timeoutSeconds=random.randint(240, 360),
        )
        async with self._client.stream(
            self._path, params=params, read_timeout=self._inactivity
        ) as resp:
            lines = Lines()
            async for chunk in resp.aiter_bytes():
                for line in lines.feed(chunk):
                    self._apply(codec.loads(line))
            if lines.pending:
                # cut off mid-event: the next watch resumes from the last event taken in, so
                # the server sends this one again
                log.warning("watch ended inside an event; resuming",
                            extra=kv(informer=self.name, bytes=lines.pending))

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise error_for(status=code, body=obj, retry_after=None, what=f"watch {self._path}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        self.changes += 1
        self.recovering = False  # the server tells of a change: an answer again
        if kind == "DELETED":
            self.store.pop(key, None)
            self._emit("DELETED", obj)
        elif kind in ("ADDED", "MODIFIED"):
            previous = self.store.get(key) if self._transform_update is not None else None
            obj = self._transform(obj) if previous is None or self._transform_update is None \
                else self._transform_update(obj, previous)
            self.store[key] = obj
            self._emit(str(kind), obj)


def _uid(obj: Body) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))
