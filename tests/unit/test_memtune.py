"""vkprovider/memtune.py: glibc is told to hand freed memory back, unless the operator's
environment already says how."""

from __future__ import annotations

import subprocess
import sys

from vkprovider.memtune import SETTINGS, tune_malloc


def _run(code: str, *args: str, env: dict[str, str]) -> str:
    # A fresh interpreter each time: mallopt settings are process-wide.
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    return done.stdout.strip()


def test_every_setting_is_applied_on_glibc() -> None:
    out = _run("from vkprovider.memtune import tune_malloc; print(','.join(tune_malloc()))",
               env={"PATH": "/usr/bin:/bin"})
    assert out.split(",") == [name for name, _, _ in SETTINGS]


def test_a_setting_the_environment_names_is_left_alone() -> None:
    applied = tune_malloc(environ={"MALLOC_ARENA_MAX": "4"})
    assert "MALLOC_ARENA_MAX" not in applied
    assert applied == [name for name, _, _ in SETTINGS if name != "MALLOC_ARENA_MAX"]


def test_large_blocks_go_back_to_the_system_once_freed() -> None:
    # glibc's default raises its mmap threshold past a block once such a block is freed, so
    # the next 192 KiB blocks come from the heap, and one still in use at its top keeps all
    # the freed ones resident (what TLS buffers and listings did to the provider). Tuned,
    # each is a mapping of its own and goes back when freed.
    code = """
import ctypes, sys
from vkprovider.memtune import tune_malloc
if sys.argv[1] == "tuned":
    tune_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1])
libc.free(libc.malloc(192 * 1024))
before = rss()
blocks = [libc.malloc(192 * 1024) for _ in range(200)]
for b in blocks:
    ctypes.memset(b, 1, 192 * 1024)
grown = rss() - before
for b in blocks[:-1]:
    libc.free(b)
print(grown, rss() - before)
"""
    grown, left = map(int, _run(code, "tuned", env={"PATH": "/usr/bin:/bin"}).split())
    assert grown > 30_000, "the blocks were touched: ~37 MiB resident"
    assert left < grown // 4
