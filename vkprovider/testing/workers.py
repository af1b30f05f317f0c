"""Which pytest-xdist worker this process runs in, and its share of what the workers share.

Why it exists: ``make test`` runs the suite on pytest-xdist workers against one control plane
and one lab network (:mod:`vkprovider.testing.plugin`). What a test picks for itself there,
loopback ports, the mock clouds' public address blocks and their route files in the address
map, would be picked alike by two tests running side by side; each worker gets its own share
instead. Outside xdist this process is worker 0 of 1 and has it all. Processes a test starts
inherit the worker's environment, so they draw from the same share.
"""

from __future__ import annotations

import os

from vkprovider.errors import VKError

#: what pytest-xdist sets in each worker: "gw0", "gw1", ... and how many there are
WORKER_VAR = "PYTEST_XDIST_WORKER"
COUNT_VAR = "PYTEST_XDIST_WORKER_COUNT"


class WorkerShareError(VKError):
    """A test asked for more of a shared resource than its worker's share."""


def index() -> int:
    """This worker's number (0 outside xdist)."""
    name = os.environ.get(WORKER_VAR, "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def count() -> int:
    """How many workers share the run (1 outside xdist)."""
    raw = os.environ.get(COUNT_VAR, "")
    return max(1, int(raw)) if raw.isdigit() else 1


def port_range(*, low: int, high: int) -> tuple[int, int]:
    """This worker's slice of the ports ``[low, high)``."""
    size = (high - low) // count()
    start = low + index() * size
    return start, start + size


def public_block(block: int, *, blocks: int) -> int:
    """The mock-cloud public address block (of ``blocks``) that a test's ``block`` is in this
    worker's share."""
    share = blocks // count()
    if not 0 <= block < share:
        raise WorkerShareError(f"public block {block} is outside a worker's share "
                               f"(0..{share - 1} with {count()} workers)")
    return index() * share + block


def tag(name: str) -> str:
    """``name``, made distinct per worker (for file names in a directory workers share)."""
    return name if count() == 1 else f"{name}-gw{index()}"
