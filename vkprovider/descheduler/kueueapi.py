"""Which Kueue API the companion talks to: discovered at start, checked, never assumed.

Why it exists: pre-warm and move-back read and write Kueue's objects (Workloads, AdmissionChecks,
queues, flavors) through ``kueue.x-k8s.io/v1beta2``. A Kueue that does not serve it (an older
release serves only ``v1beta1``) used to look "not installed": every path answered 404, logged at
info level, and an AdmissionCheck of ours stayed Active with nobody serving it, so the gangs of
its ClusterQueue waited forever. Now the served versions are read once at start
(:func:`vkprovider.kube.discovery.served_versions`):

* not served at all: Kueue is not installed (yet); its objects are watched at the supported
  version and treated as empty (installing Kueue later needs no restart);
* a supported version served: that one is used;
* only others: the companion logs an error, leaves Kueue's objects alone, and marks each
  AdmissionCheck of ours ``Active=False`` with reason ``UnsupportedKueueVersion`` (through the
  version the server does serve), so Kueue holds its ClusterQueue and says why.

Supported: :data:`SUPPORTED` (docs/kueue.md has the tested matrix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vkprovider.kube import KubeClient
from vkprovider.kube.discovery import served_versions

GROUP = "kueue.x-k8s.io"
#: API versions of Kueue this code speaks, best first.
SUPPORTED: tuple[str, ...] = ("v1beta2",)
#: What it was tested against (docs/kueue.md, "Versions").
TESTED = "Kueue v0.17.0 on Kubernetes v1.37.2"
REASON_UNSUPPORTED = "UnsupportedKueueVersion"


@dataclass(frozen=True)
class KueueAPI:
    """The Kueue API version in use and, when it cannot be used, why."""

    version: str = SUPPORTED[0]
    served: tuple[str, ...] = ()  # empty: Kueue not installed when discovered
    problem: str = ""  # not "": installed but unsupported (the message for humans)

    @property
    def base(self) -> str:
        """The path prefix, ``/apis/kueue.x-k8s.io/<version>``."""
        return f"/apis/{GROUP}/{self.version}"

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    @property
    def usable(self) -> bool:
        return not self.problem


def choose(served: Sequence[str] | None, preferred: str = "") -> KueueAPI:
    """The Kueue API to use, given the versions the server serves (None: not installed)."""
    if not served:
        return KueueAPI()
    for version in SUPPORTED:
        if version in served:
            return KueueAPI(version=version, served=tuple(served))
    version = preferred if preferred in served else served[0]
    return KueueAPI(version=version, served=tuple(served), problem=(
        f"Kueue serves {GROUP} {', '.join(served)}, and this vkprovider needs "
        f"{' or '.join(SUPPORTED)} (tested: {TESTED}); upgrade Kueue"))


async def discover(client: KubeClient) -> KueueAPI:
    """Ask the API server which Kueue versions it serves (one GET) and choose."""
    found = await served_versions(client, GROUP)
    if found is None:
        return choose(None)
    return choose(found.versions, found.preferred)
