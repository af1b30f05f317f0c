"""Every instance a cloud reports passes the address filter before the service uses it.

Why it exists: ``Instance.published`` is untrusted input (``providers/addresses.py`` says why and
what is refused). The pod controller takes instances from adapters at exactly two points, a
sweep's ``list()`` and a ``create()``; both hand them to :meth:`AddressScreen.screen`, which
returns the instance without the refused entries. Everything downstream (probes, the
provider-managed EndpointSlices, ``status.podIP``, the ``vkprovider.io/ports`` annotation) reads
only screened instances, so no adapter, built in or third-party, can forget the filter.

A refusal is counted once per pod and address (``vkprovider_endpoints_refused_total``) and told
once as a Warning Event ``EndpointRefused`` on the pod (:meth:`AddressScreen.untold`), not at
every sweep. The address itself is in the Event (it is not a secret); the message says which
class refused it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from providers.addresses import AddressPolicy, Refused, describe, screen
from providers.base import Instance
from vkprovider.logs import kv
from vkprovider.metrics import Metrics

__all__ = ["EVENT_REASON", "AddressScreen", "refusal_message"]

log = logging.getLogger(__name__)

#: The reason of the Warning Event a refused address gets on its pod.
EVENT_REASON = "EndpointRefused"

_Key = tuple[str, str]  # (host, reason)


def refusal_message(*, provider: str, instance: Instance, refused: Refused) -> str:
    """What the pod's Event says about one refused address."""
    p = refused.published
    host = f"[{p.host}]" if ":" in p.host and not p.host.startswith("[") else p.host
    return (f"{provider} published {host}:{p.port} for container port "
            f"{p.container_port}/{p.protocol} of instance {instance.id}: "
            f"{describe(refused.reason)} ({refused.reason}); not probed and not published to "
            "Services")


class AddressScreen:
    """Screens instances with one :class:`~providers.addresses.AddressPolicy`; remembers, per
    pod, the refusals already counted and the ones still to tell."""

    def __init__(self, *, policy: AddressPolicy, metrics: Metrics) -> None:
        self.policy = policy
        self._metrics = metrics
        self._seen: dict[str, set[_Key]] = {}  # uid -> refusals counted
        self._untold: dict[str, list[tuple[str, Instance, Refused]]] = {}
        # uid -> (the adapter's instance, what screening it gave), for pods with a refusal only:
        # adapters hand back the same Instance while nothing changed (providers/listcache.py),
        # so such a pod keeps its screened record (the sweep's "listed as before"). A clean
        # instance screens to itself: the sweep knows it by identity (``passed``), and 5,000
        # steady pods keep no entry here.
        self._last: dict[str, tuple[Instance, Instance]] = {}

    @staticmethod
    def passed(*, instance: Instance, screened: Instance | None) -> bool:
        """Whether ``instance`` is known to pass: ``screened`` (what screening gave before)
        is the very same object, which screening returns only for an instance it refused
        nothing of. Screening then would give ``instance`` again."""
        return screened is instance

    def screen(self, *, uid: str, provider: str, instance: Instance) -> Instance:
        """``instance`` without the published entries the policy refuses (the same object
        when it refuses none)."""
        last = self._last.get(uid)
        if last is not None and last[0] is instance:
            return last[1]
        result = self._screen(uid=uid, provider=provider, instance=instance)
        if result is instance:
            self._last.pop(uid, None)
        else:
            self._last[uid] = (instance, result)
        return result

    def _screen(self, *, uid: str, provider: str, instance: Instance) -> Instance:
        if not instance.published:
            return instance
        allowed, refused = screen(instance.published, policy=self.policy)
        if not refused:
            return instance
        seen = self._seen.setdefault(uid, set())
        for r in refused:
            p = r.published
            key = (p.host, r.reason)  # once per address, whatever ports it was given for
            if key in seen:
                continue
            seen.add(key)
            self._metrics.endpoints_refused.labels(provider, r.reason).inc()
            self._untold.setdefault(uid, []).append((provider, instance, r))
            log.warning("published address refused", extra=kv(
                uid=uid, provider=provider, instance=instance.id, host=p.host, port=p.port,
                container_port=p.container_port, reason=r.reason))
        return dataclasses.replace(instance, published=allowed)

    def untold(self, uid: str) -> list[str]:
        """Event messages for this pod's refusals not told yet (each returned once)."""
        return [refusal_message(provider=provider, instance=instance, refused=r)
                for provider, instance, r in self._untold.pop(uid, ())]

    def forget(self, uid: str) -> None:
        self._seen.pop(uid, None)
        self._untold.pop(uid, None)
        self._last.pop(uid, None)

    def keep_only(self, uids: Iterable[str]) -> None:
        """Forget pods not in ``uids`` (bounded memory across pod churn)."""
        live = set(uids)
        for uid in [u for u in (*self._seen, *self._last) if u not in live]:
            self.forget(uid)
