"""Per-pod phase trace of a provider under the burst bench (``bench/burst.py --phases``).

Why it exists: the burst's own figures (bind -> cloud create, create -> Running) are taken from
outside, so they mix the provider's work with the API server's watch delivery and its answer to
each status write, which on a shared machine vary run to run by more than a regression to find.
This times the steps inside the provider, per pod, for any checkout of the project (the
``--baseline`` tree too: it patches by name what every version has): the watch event, the first
reconcile taking the pod, the cloud create call and its answer, the first status write and its
answer. One line per step, ``<step> <pod uid> <unix time>``, to ``$VKP_PHASE_TRACE.<pid>``.

Not project code: the bench puts this directory first on the provider's PYTHONPATH only when
asked, and Python imports ``sitecustomize`` at start-up. Nothing is traced without the variable.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_PREFIX = os.environ.get("VKP_PHASE_TRACE")
_TARGETS = ("vkprovider.node.pods", "providers.mock.client", "vkprovider.kube.podstatus_write")


class _Trace:
    def __init__(self, path: str) -> None:
        self._path = path
        self._out: Any = None
        self._seen: set[tuple[str, str]] = set()

    def step(self, kind: str, uid: str) -> None:
        """The first time ``uid`` reaches ``kind`` (later ones are retries and resyncs)."""
        if (kind, uid) in self._seen:
            return
        self._seen.add((kind, uid))
        if self._out is None:
            self._out = open(self._path, "a", buffering=1 << 16)  # noqa: SIM115
            atexit.register(self._out.flush)
        self._out.write(f"{kind} {uid} {time.time():.6f}\n")

    def flush(self) -> None:
        if self._out is not None:
            self._out.flush()


def _patch(name: str, module: ModuleType, trace: _Trace) -> None:
    if name == "vkprovider.node.pods":
        cls = module.PodController
        on_pod, reconcile, sweep = cls._on_pod, cls.reconcile, cls.sweep

        def _on_pod(self: Any, event: str, pod: dict[str, Any]) -> None:
            trace.step("watch", str(pod["metadata"].get("uid", "")))
            on_pod(self, event, pod)

        async def _reconcile(self: Any, uid: str) -> None:
            trace.step("worker", uid)
            await reconcile(self, uid)

        async def _sweep(self: Any) -> None:
            await sweep(self)
            trace.flush()  # a sweep is rare: the file is complete up to here

        cls._on_pod, cls.reconcile, cls.sweep = _on_pod, _reconcile, _sweep
    elif name == "providers.mock.client":
        cls = module.MockProvider
        create = cls.create

        async def _create(self: Any, spec: Any) -> Any:
            uid = str(spec.name)[-36:]  # "<node>-<pod uid>"
            trace.step("create_call", uid)
            try:
                return await create(self, spec)
            finally:
                trace.step("create_answer", uid)

        cls.create = _create
    elif name == "vkprovider.kube.podstatus_write":
        cls = module.PodStatusWriter
        write = cls.write

        async def _write(self: Any, **kwargs: Any) -> Any:
            uid = str(kwargs["pod"]["metadata"].get("uid"))
            trace.step("status_write", uid)
            try:
                return await write(self, **kwargs)
            finally:
                trace.step("status_answer", uid)

        cls.write = _write


class _Finder(importlib.abc.MetaPathFinder):
    """Patches each traced module right after it is first executed."""

    def __init__(self, trace: _Trace) -> None:
        self._trace = trace

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module
        trace = self._trace

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(fullname, module, trace)

        loader.exec_module = exec_module
        return spec


if _PREFIX:
    sys.meta_path.insert(0, _Finder(_Trace(f"{_PREFIX}.{os.getpid()}")))
