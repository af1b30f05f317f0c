"""How many GPUs a container or a pod asks for.

Why it exists: the same pod is counted by translation (how many GPUs to rent), by budgets (how
many GPUs a policy has outside) and by move-back (does an internal node have that many free).
When each read the number its own way, a limit written ``"1000m"`` or ``"1e0"`` rented one GPU but
counted as none against a ``maxGPUs`` budget. Here it is read once, the Kubernetes way:

* ``nvidia.com/gpu`` is an extended resource. Kubernetes requires a limit for it, defaults the
  request to the limit, and refuses a request that differs from the limit, so the limit is the
  count; a request is read only when no limit is written (an object that bypassed the API
  server, such as a pod template in a unit test);
* the amount is a quantity in any notation (``1``, ``1000m``, ``1e0``) and must be a whole,
  non-negative number (:func:`~vkprovider.semantics.quantity.parse_count`);
* a pod's count is the sum over ``spec.containers``. Init containers are not counted: the
  provider refuses pods that have them, and the callers only ever counted app containers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vkprovider.semantics.quantity import QuantityError, parse_count

__all__ = ["GPU_RESOURCE", "container_gpus", "pod_gpus", "pod_spec_gpus"]

GPU_RESOURCE = "nvidia.com/gpu"


def _mapping(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def container_gpus(container: Mapping[str, Any], *, resource: str = GPU_RESOURCE) -> int:
    """The container's count of ``resource``: its limit, else its request, else 0.

    Raises :class:`~vkprovider.semantics.quantity.QuantityError` naming the value when it is not
    a whole, non-negative quantity.
    """
    resources = _mapping(container, "resources")
    for kind in ("limits", "requests"):
        raw = _mapping(resources, kind).get(resource)
        if raw is not None:
            return parse_count(raw)
    return 0


def pod_spec_gpus(
    spec: Mapping[str, Any], *, resource: str = GPU_RESOURCE, skip_invalid: bool = False
) -> int:
    """The sum of :func:`container_gpus` over a pod spec's (or pod template's) containers.

    With ``skip_invalid`` a container whose amount does not parse counts 0 instead of raising:
    for tallies over many pods, where one object that bypassed validation must not stop the
    count of all the others.
    """
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    total = 0
    for container in containers if isinstance(containers, list) else []:
        try:
            total += container_gpus(container, resource=resource)
        except QuantityError:
            if not skip_invalid:
                raise
    return total


def pod_gpus(
    pod: Mapping[str, Any], *, resource: str = GPU_RESOURCE, skip_invalid: bool = False
) -> int:
    """:func:`pod_spec_gpus` of a whole pod object (its ``spec``)."""
    return pod_spec_gpus(_mapping(pod, "spec"), resource=resource, skip_invalid=skip_invalid)
