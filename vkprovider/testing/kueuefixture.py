"""The ``kueue`` pytest fixture: real Kueue beside the session's cluster.

Why it exists apart from :mod:`vkprovider.testing.kueue`: that module also serves ``vkprovider
demo`` and ``dev up --kueue``, which run where pytest is not installed (the image ships only the
runtime dependencies); the fixture, and its pytest import, live here.
``from vkprovider.testing.kueue import kueue`` still finds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.kueue import KueueManager


@pytest.fixture(scope="session")
def kueue(local_cluster: LocalCluster) -> Iterator[KueueManager]:
    """Real Kueue (``VKP_KUEUE_BIN``) beside the session's cluster, started once per run.

    A missing build is an error, not a skip: ``export VKP_KUEUE_BIN=$(bash tools/kueue/build.sh)``.
    """
    manager = KueueManager(cluster=local_cluster)
    try:
        asyncio.run(manager.start())
        yield manager
    finally:
        asyncio.run(manager.stop())
