"""API discovery: which versions of an API group the server serves.

Why it exists: the companion works with Kueue's objects through one API version. Assuming it (a
hard-coded path) turned an older Kueue into a 404 that read as "Kueue not installed", logged at
info level, while its AdmissionCheck sat there doing nothing. Asking the server once at start
(``GET /apis/<group>``) tells "not installed" from "installed, another version".
"""

from __future__ import annotations

from dataclasses import dataclass

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import NotFoundError


@dataclass(frozen=True)
class GroupVersions:
    """What the server serves of one API group."""

    group: str
    versions: tuple[str, ...]  # in the server's order
    preferred: str


async def served_versions(client: KubeClient, group: str) -> GroupVersions | None:
    """The versions the server serves of ``group``; None when it serves none (not installed)."""
    try:
        body = await client.get(f"/apis/{group}")
    except NotFoundError:
        return None
    versions = tuple(str(v.get("version")) for v in body.get("versions") or []
                     if isinstance(v, dict) and v.get("version"))
    if not versions:
        return None
    preferred = str((body.get("preferredVersion") or {}).get("version") or versions[0])
    return GroupVersions(group=group, versions=versions, preferred=preferred)
