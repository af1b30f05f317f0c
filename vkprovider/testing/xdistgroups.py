"""pytest-xdist's ``--dist loadgroup``, with the groups carried beside the test ids.

Why it exists: xdist's own loadgroup tells the controller a test's ``xdist_group`` by appending
``@group`` to the test's id on the worker. pytest 9.2 derives ids from structured node ids, so
that suffix no longer takes and every test is scheduled alone, silently
(pytest-dev/pytest-xdist#1386). Here each worker writes the groups it collected to the folder
the controller shares with the workers (:mod:`vkprovider.testing.plugin`), and this scheduler
reads them: a group is one unit of work, run on one worker, one test at a time, as xdist means
it; a test with no group is a unit of its own. Units are handed out largest first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

_PREFIX = "groups-"


def write_groups(*, folder: Path, worker: str, items: list[pytest.Item]) -> None:
    """Record, for the controller, the group of every test of this worker's collection."""
    groups: dict[str, str] = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args
                                      else mark.kwargs.get("name", "default"))
    tmp = folder / f".{_PREFIX}{worker}.json"
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, folder / f"{_PREFIX}{worker}.json")


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """Load scheduling by unit: a group's tests, or one test alone."""

    def __init__(self, config: pytest.Config, log: Producer | None, *, folder: Path) -> None:
        super().__init__(config, log)
        self._folder = folder
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # first asked once every worker's collection is in
            self._groups = {}
            for path in sorted(self._folder.glob(f"{_PREFIX}*.json")):
                self._groups.update(json.loads(path.read_text()))
        group = self._groups.get(nodeid)
        return nodeid if group is None else f"group:{group}"
