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
someone has since changed. Then the status may not go as it is: its carried-over fields are the
stale copy's, and sending them would put back what others changed meanwhile (a readiness gate's
condition set False, ``DisruptionTarget``, our own ``GPUHealthy`` written by node/gpuhealth.py).
So the fallback patch carries only what this write changes relative to the copy it was built
from: the fields and conditions (by type) the builder set to something new. What others wrote
since, on any field this write does not change, survives. A value of ours derived from their
stale field (Ready from a readiness gate) is put right by the next sweep, which the watch
starts when it brings the newer pod. A patch that never met a 409 (a copy with no version, or a
Role that refuses the replace) is just as blind to what happened since, and is built the same way.
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


def strategic_patch(*, status: Body, annotations: Mapping[str, str] | None = None,
                    base: Mapping[str, Any] | None = None) -> Body:
    """The strategic merge patch of the same write (the fallback).

    ``base``: the status of the copy ``status`` was built from. Given, the patch carries only what
    differs from it (:func:`status_changes`), so what others wrote since on the fields this write
    leaves alone is not put back to the copy's values.

    podIPs/hostIPs merge by ``ip`` in a strategic merge patch, so a pod whose instance came back
    with a new address would list both, which the API server refuses ("no more than one IP for
    each IP family"): they are marked to replace the stored lists.
    """
    out = copy.copy(status) if base is None else status_changes(base=base, status=status)
    for key in ("podIPs", "hostIPs"):
        if out.get(key) is not None:
            out[key] = [*out[key], {"$patch": "replace"}]
    body: Body = {"status": out}
    if annotations:
        body["metadata"] = {"annotations": dict(annotations)}
    return body


def status_changes(*, base: Mapping[str, Any], status: Mapping[str, Any]) -> Body:
    """What ``status`` changes relative to ``base``, as a strategic merge patch of ``status``.

    A field equal in both is left out; a field ``base`` has and ``status`` dropped is sent as
    null (deleted). Conditions go by type: only those that differ from ``base``'s condition of
    that type, and a type ``status`` dropped as a ``$patch: delete`` of that type.
    """
    out: Body = {}
    for key, value in status.items():
        if key != "conditions" and base.get(key) != value:
            out[key] = value
    for key in base:
        if key != "conditions" and key not in status:
            out[key] = None
    before = _conditions_by_type(base)
    after = _conditions_by_type(status)
    changed: list[Any] = [c for t, c in after.items() if before.get(t) != c]
    changed += [{"type": t, "$patch": "delete"} for t in before if t not in after]
    if changed:
        out["conditions"] = changed
    return out


def _conditions_by_type(status: Mapping[str, Any]) -> dict[Any, Any]:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return {}
    return {c.get("type"): c for c in conditions if isinstance(c, Mapping)}


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
        ``resourceVersion``, or on a conflict (or with no version) a strategic merge patch of
        what ``status`` changes relative to ``pod``'s status."""
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
            except ConflictError:  # someone wrote the pod after our copy: send only our changes
                landed = StatusWrite.PATCHED_AFTER_CONFLICT
            except ForbiddenError:
                self.replace_allowed = False
                log.warning("RBAC refuses update on pods/status: pod statuses are patched "
                            "instead (grant it as manifests/base/rbac.yaml does)")
        body = strategic_patch(status=status, annotations=annotations,
                               base=pod.get("status") or {})
        if not body["status"] and "metadata" not in body:
            return landed  # this write changes nothing of the copy: nothing to send
        try:
            await self._client.patch(path, body, patch_type="strategic", want_body=False)
        except NotFoundError:
            return StatusWrite.GONE
        return landed
