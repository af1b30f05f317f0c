"""The vendored cloud specs are the files their README names, unmodified.

Why it exists: the contract tests are only as good as the specs they validate against; an edit
to a vendored spec (to make a failing test pass, say) would silently weaken every contract test.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tests.fakes.common import VENDORED_SPECS

ROW = re.compile(r"^\| (?P<file>[\w./-]+) \|.*\| (?P<sha>[0-9a-f]{64}) \|$")


def _recorded() -> dict[str, str]:
    rows = (ROW.match(line) for line in (VENDORED_SPECS / "README.md").read_text().splitlines())
    return {m["file"]: m["sha"] for m in rows if m}


def test_every_vendored_spec_matches_its_recorded_hash() -> None:
    recorded = _recorded()
    assert set(recorded) == {
        "runpod/openapi-v2.json", "vastai/openapi.yaml", "salad/salad-cloud.yaml"}
    for name, sha in recorded.items():
        assert hashlib.sha256((VENDORED_SPECS / name).read_bytes()).hexdigest() == sha, name


def test_every_file_in_the_folder_is_recorded() -> None:
    files = {
        str(p.relative_to(VENDORED_SPECS)) for p in Path(VENDORED_SPECS).rglob("*") if p.is_file()
    }
    assert files - {"README.md"} == set(_recorded())
