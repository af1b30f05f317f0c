"""One write of a pod's status (and annotations with it): a guarded replace, else a patch.

Why it exists: the pod status write is the one API write every pod makes on its way to Running,
so its cost on the API server is paid per pod in a burst. A ``PUT`` of ``pods/status`` with the
pod's cached ``resourceVersion`` costs the API server and etcd less than the strategic merge
patch it replaces (no patch to apply against the schema): 0.25-0.85 ms less control-plane CPU
per write of 3.1-5.3 ms, by ``bench/statuswrite.py`` on two machines (docs/architecture.md,
"Choices and their reasons"). It is what the Go virtual-kubelet does (``UpdateStatus``).

A replace sends the whole status, so it is only as right as the copy it starts from. The status
builders (``vkprovider.node.podstatus``) start from the cached status and keep what others wrote
there (conditions of readiness gates and DisruptionTarget, qosClass, nominatedNodeName); the
``resourceVersion`` precondition makes the API server refuse (409) a replace built on a copy
someone has since changed. Then the same status goes as a strategic merge patch, which merges
over their write as every write here did before: nobody's field is ever lost to a stale cache.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from enum import Enum
from typing import Any

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import ConflictError, ForbiddenError, NotFoundError

log = logging.getLogger(__name__)

Body = dict[str, Any]


class StatusWrite(Enum):
    """How a status write landed (for the writes-by-kind metric)."""

    REPLACED = "replaced"   # one PUT
    PATCHED = "patched"     # one patch: the copy had no resourceVersion to guard a replace
    PATCHED_AFTER_CONFLICT = "patched after conflict"  # a PUT refused (409), then the patch
    GONE = "gone"           # the pod no longer exists: nothing to write


def pod_path(pod: Mapping[str, Any]) -> str:
    """The API path of ``pod`` (a dict with metadata.namespace and metadata.name)."""
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


def pod_status_path(pod: Mapping[str, Any]) -> str:
    """The path of ``pod``'s status subresource: every status write of the provider goes here."""
    return f"{pod_path(pod)}/status"


def replacement(*, pod: Mapping[str, Any], status: Body,
                annotations: Mapping[str, str] | None = None) -> Body:
    """The body of the ``PUT``: the cached pod with ``status`` and ``annotations`` set.

    ``pod`` is not changed (a cache's copy is shared). Its spec rides along unchanged: the API
    server keeps the stored spec on ``pods/status`` whatever is sent, but admission sees the body,
    so it must be the pod's own.
    """
    meta = dict(pod.get("metadata") or {})
    meta.pop("managedFields", None)  # omitted: the API server keeps the stored ones
    if annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": pod.get("spec") or {}, "status": status}


def strategic_patch(*, status: Body, annotations: Mapping[str, str] | None = None) -> Body:
    """The strategic merge patch of the same write (the fallback).

    podIPs/hostIPs merge by ``ip`` in a strategic merge patch, so a pod whose instance came back
    with a new address would list both, which the API server refuses ("no more than one IP for
    each IP family"): they are marked to replace the stored lists.
    """
    out = copy.copy(status)
    for key in ("podIPs", "hostIPs"):
        if key in out:
            out[key] = [*out[key], {"$patch": "replace"}]
    body: Body = {"status": out}
    if annotations:
        body["metadata"] = {"annotations": dict(annotations)}
    return body


class PodStatusWriter:
    """Writes pod statuses for one process; remembers when RBAC refuses the replace.

    A provider upgraded before its Role (which grants ``update`` on ``pods/status`` since the
    replace came in, manifests/base/rbac.yaml) gets 403 on the ``PUT``: it then patches, as it
    did before, and says so once, rather than paying a refused request per write.
    """

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self.replace_allowed = True

    async def write(self, *, pod: Mapping[str, Any], status: Body,
                    annotations: Mapping[str, str] | None = None) -> StatusWrite:
        """Write ``status`` (and ``annotations``) on ``pod``: a replace guarded by the copy's
        ``resourceVersion``, or on a conflict (or with no version) the strategic merge patch."""
        path = pod_status_path(pod)
        landed = StatusWrite.PATCHED
        if self.replace_allowed and (pod.get("metadata") or {}).get("resourceVersion"):
            try:
                await self._client.replace(path, replacement(pod=pod, status=status,
                                                             annotations=annotations),
                                           want_body=False)
                return StatusWrite.REPLACED
            except NotFoundError:
                return StatusWrite.GONE
            except ConflictError:  # someone wrote the pod after our copy: merge over theirs
                landed = StatusWrite.PATCHED_AFTER_CONFLICT
            except ForbiddenError:
                self.replace_allowed = False
                log.warning("RBAC refuses update on pods/status: pod statuses are patched "
                            "instead (grant it as manifests/base/rbac.yaml does)")
        try:
            await self._client.patch(path, strategic_patch(status=status, annotations=annotations),
                                     patch_type="strategic", want_body=False)
        except NotFoundError:
            return StatusWrite.GONE
        return landed
