"""Real Kueue beside a :class:`LocalCluster`: its CRDs, its manager, its webhooks on loopback.

Why it exists: training gangs reach the cluster through Kueue (a ClusterQueue's quota admits a
suspended Job, the scheduler then places its pods), and what vkprovider does around that must be
tested against the real Kueue, not a simulation. ``tools/kueue/build.sh`` builds the manager from
the ``sigs.k8s.io/kueue`` Go module (v0.17.0) and copies the module's ``config/components/crd``
and ``config/components/webhook`` beside the binary; ``VKP_KUEUE_BIN`` names that folder.

How it runs outside a cluster (docs/kueue.md):

* ``internalCertManagement.enable: false`` and ``webhook.certDir``: the webhook server on
  ``127.0.0.1:<port>`` serves a certificate signed by the local cluster CA;
* the webhook configurations are the module's ``manifests.yaml`` with each ``clientConfig`` turned
  into ``url: https://127.0.0.1:<port>/<path>`` and the CA bundle (webhooks of job frameworks that
  are not enabled are left out: Kueue would only answer them with a no-op), and the CRDs get the
  module's conversion-webhook patches the same way;
* Kueue v0.17.0 reads its metrics certificate from the fixed path
  ``/etc/kueue/metrics/certs/tls.{crt,key}`` whenever internal cert management is off, even with
  the metrics server disabled (``bindAddress: "0"``). Rather than writing into the machine's
  ``/etc``, the manager runs in a private mount namespace (``unshare``) where an overlay on
  ``/etc`` adds that folder from the cluster's work directory; nothing outside sees it;
* the on-demand visibility server (an aggregated API reading certificates from ``/visibility``)
  is off: feature gate ``VisibilityOnDemand=false``.

Readiness means: the manager's ``/readyz`` answers (its webhook server is serving), the mutating
webhooks add Kueue's finalizer to a dry-run ResourceFlavor and ClusterQueue, the validating
webhook refuses an invalid ClusterQueue, and the conversion webhook converts a v1beta1 one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from vkprovider.errors import VKError
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.testing.cluster import Component, LocalCluster, free_port

KUEUE_VERSION = "v0.17.0"
NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
API = f"/apis/{GROUP}/v1beta2"
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
FINALIZER = f"{GROUP}/resource-in-use"
DEFAULT_FRAMEWORKS = ("batch/job",)
METRICS_CERT_DIR = "kueue/metrics/certs"  # below /etc, where Kueue v0.17.0 looks for it
ADMISSION_PATH = "/apis/admissionregistration.k8s.io/v1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "kueue" / "build.sh"
BUILD_HINT = "run `export VKP_KUEUE_BIN=$(bash tools/kueue/build.sh)` (a cold build takes minutes)"


class KueueError(VKError):
    """Kueue could not be found, started or made ready; the message names what did not come up."""


def find_kueue() -> Path:
    """The folder from ``tools/kueue/build.sh``: ``VKP_KUEUE_BIN`` when set, else the script is
    run (warm: it prints the cached folder at once; cold: it builds, minutes), as the other
    tools of the test suite (helm, kubectl, the image's root filesystem) are found."""
    env = os.environ.get("VKP_KUEUE_BIN")
    if not env and not BUILD_SCRIPT.exists():  # installed, not a checkout (the image)
        raise KueueError("no Kueue build: set VKP_KUEUE_BIN, or run from a checkout that has "
                         "tools/kueue/build.sh")
    if not env:
        built = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                               check=False)
        if built.returncode != 0:
            raise KueueError(f"tools/kueue/build.sh failed:\n{built.stderr[-2000:]}")
        env = built.stdout.strip().splitlines()[-1] if built.stdout.strip() else ""
        os.environ["VKP_KUEUE_BIN"] = env  # once per session
    folder = Path(env)
    wanted = [folder / "kueue", folder / "config" / "crd" / "kustomization.yaml",
              folder / "config" / "webhook" / "manifests.yaml"]
    missing = [str(p) for p in wanted if not p.is_file()]
    if missing:
        raise KueueError(f"VKP_KUEUE_BIN={env} lacks {', '.join(missing)}: {BUILD_HINT}")
    return folder


# ---- the module's config, pointed at loopback (pure functions) ----------------------------------


def _framework(webhook: dict[str, Any]) -> str | None:
    """The job framework a webhook of ``manifests.yaml`` serves (``batch/job``, ``pod``, ...), or
    ``None`` for Kueue's own API (ClusterQueue, Workload, ...), which is always kept."""
    group = webhook["rules"][0]["apiGroups"][0]
    if group == GROUP:
        return None
    kind = webhook["name"].removesuffix(".kb.io")[1:]  # "mjob.kb.io" -> "job"
    return kind if group in ("", "apps") else f"{group}/{kind}"


def _namespace_selectors(kustomization: dict[str, Any], namespace: str
                         ) -> dict[str, dict[str, Any]]:
    """Webhook name -> namespaceSelector, from the module's webhook kustomization patches (they
    keep pod, deployment and statefulset webhooks away from kube-system and Kueue's namespace)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in kustomization.get("patches") or []:
        patch = yaml.safe_load(entry.get("patch") or "{}") or {}
        for hook in patch.get("webhooks") or []:
            if "namespaceSelector" in hook:
                text = yaml.safe_dump(hook["namespaceSelector"]).replace(NAMESPACE, namespace)
                out[hook["name"]] = yaml.safe_load(text)
    return out


def loopback_webhooks(*, manifests: list[dict[str, Any]], kustomization: dict[str, Any],
                      url: str, ca_bundle: str, frameworks: tuple[str, ...] = DEFAULT_FRAMEWORKS,
                      namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The module's webhook configurations with every service ``clientConfig`` turned into
    ``url`` + path and ``ca_bundle``, named as Kueue's own install names them (``kueue-``)."""
    selectors = _namespace_selectors(kustomization, namespace)
    out = []
    for doc in manifests:
        conf = copy.deepcopy(doc)
        conf["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        hooks = []
        for hook in conf.get("webhooks") or []:
            fw = _framework(hook)
            if fw is not None and fw not in frameworks:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if hook["name"] in selectors:
                hook["namespaceSelector"] = selectors[hook["name"]]
            hooks.append(hook)
        conf["webhooks"] = hooks
        out.append(conf)
    return out


def loopback_crds(*, crd_dir: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The CRDs of ``crd_dir/kustomization.yaml`` with its active conversion-webhook patches,
    each webhook's ``clientConfig`` turned into ``url`` + path and ``ca_bundle``."""
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    crds = {}
    for rel in kustomization["resources"]:
        crd = yaml.safe_load((crd_dir / rel).read_text())
        crds[crd["metadata"]["name"]] = crd
    for entry in kustomization.get("patches") or []:
        if "path" not in entry:
            continue
        patch = yaml.safe_load((crd_dir / entry["path"]).read_text())
        conversion = copy.deepcopy(patch["spec"]["conversion"])
        path = conversion["webhook"]["clientConfig"]["service"]["path"]
        conversion["webhook"]["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
        crds[patch["metadata"]["name"]]["spec"]["conversion"] = conversion
    return list(crds.values())


def configuration(*, namespace: str, webhook_port: int, health_port: int, cert_dir: Path,
                  frameworks: tuple[str, ...]) -> dict[str, Any]:
    """Kueue's Configuration (``config.kueue.x-k8s.io/v1beta2``) for a manager on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": namespace,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(frameworks)},
        "featureGates": {"VisibilityOnDemand": False},
    }


def _unshare() -> list[str]:
    """``unshare`` into a private mount namespace (a user namespace too when not root)."""
    argv = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        argv.append("--map-root-user")
    return argv


def _unshare_prefix(*, upper: Path, work: Path) -> list[str]:
    """argv that runs the rest in a private mount namespace with ``upper`` overlaid on /etc."""
    script = 'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc ' \
             '&& shift 2 && exec "$@"'
    return [*_unshare(), "--", "sh", "-c", script, "sh", str(upper), str(work)]


# ---- the manager ------------------------------------------------------------------------------


class KueueManager:
    """Kueue beside a started :class:`LocalCluster`: ``await start()``, ``await stop()``.

    The manager process is one of the cluster's components (its log is ``kueue.log`` in the
    cluster's log folder and ``cluster.stop()`` ends it too); :meth:`stop` also deletes the
    webhook configurations, so nothing in the cluster keeps calling a port nobody serves.
    """

    def __init__(self, *, cluster: LocalCluster, frameworks: tuple[str, ...] = DEFAULT_FRAMEWORKS,
                 namespace: str = NAMESPACE, home: Path | None = None) -> None:
        self.cluster = cluster
        self.frameworks = frameworks
        self.namespace = namespace
        self.home = home
        self.work_dir = cluster.work_dir / "kueue"
        self.webhook_port = 0
        self.health_port = 0
        self.component: Component | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    async def start(self, *, timeout: float = 120.0) -> None:
        """Install the CRDs, start the manager and its webhooks; raise :class:`KueueError`
        naming what did not come up (with the manager's last log lines)."""
        home = self.home or find_kueue()
        _check_unshare()
        deadline = time.monotonic() + timeout
        self._prepare()
        ca_bundle = base64.b64encode(self.cluster.ca_path.read_bytes()).decode()
        async with self.cluster.client() as kube:
            await _ensure_namespace(kube, self.namespace)
            crds = loopback_crds(crd_dir=home / "config" / "crd", url=self.url,
                                 ca_bundle=ca_bundle)
            for crd in crds:
                await _apply(kube, CRD_PATH, crd)
            await self._until("Kueue's CRDs Established",
                              lambda: _established(kube, [c["metadata"]["name"] for c in crds]),
                              deadline)
            self._start_process(home)
            await self._until("the manager's /readyz", self._readyz, deadline)
            webhook_dir = home / "config" / "webhook"
            confs = loopback_webhooks(
                manifests=list(yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text())),
                kustomization=yaml.safe_load((webhook_dir / "kustomization.yaml").read_text()),
                url=self.url, ca_bundle=ca_bundle, frameworks=self.frameworks,
                namespace=self.namespace)
            for conf in confs:
                kind = conf["kind"].lower() + "s"
                await _apply(kube, f"{ADMISSION_PATH}/{kind}", conf)
            await self._until("the mutating webhook (a dry-run ResourceFlavor gets Kueue's "
                              "finalizer)", lambda: _mutated(kube, "resourceflavors"), deadline)
            await self._until("the mutating webhook (a dry-run ClusterQueue gets Kueue's "
                              "finalizer)", lambda: _mutated(kube, "clusterqueues"), deadline)
            await self._until("the validating webhook (refuses an invalid ClusterQueue)",
                              lambda: _refused(kube), deadline)
            await self._until("the conversion webhook (a v1beta1 ClusterQueue, dry-run)",
                              lambda: _converted(kube), deadline)

    async def stop(self) -> None:
        """Delete the webhook configurations, then stop the manager (the CRDs stay)."""
        with contextlib.suppress(APIError, OSError):
            async with self.cluster.client() as kube:
                for kind, name in (("mutatingwebhookconfigurations", MUTATING),
                                   ("validatingwebhookconfigurations", VALIDATING)):
                    with contextlib.suppress(NotFoundError):
                        await kube.delete(f"{ADMISSION_PATH}/{kind}/{name}")
        if self.component is not None:
            self.component.stop()

    def tail(self, lines: int = 40) -> str:
        return self.component.tail(lines) if self.component is not None else ""

    # ---- internals ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Ports, certificates (signed by the cluster CA) and the Configuration file."""
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.webhook_port, self.health_port = free_port(), free_port()
        cert_dir = self.work_dir / "webhook-certs"
        metrics_dir = self.work_dir / "etc-upper" / METRICS_CERT_DIR
        (self.work_dir / "etc-work").mkdir(parents=True)
        for folder, stem in ((cert_dir, "kueue-webhook"), (metrics_dir, "kueue-metrics")):
            folder.mkdir(parents=True)
            pair = self.cluster.ca.issue(stem=stem, common_name=stem, server=True,
                                         hosts=("127.0.0.1", "localhost"))
            shutil.copyfile(pair.cert, folder / "tls.crt")
            shutil.copyfile(pair.key, folder / "tls.key")
        self.config_path = self.work_dir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(configuration(
            namespace=self.namespace, webhook_port=self.webhook_port,
            health_port=self.health_port, cert_dir=cert_dir, frameworks=self.frameworks)))

    def _start_process(self, home: Path) -> None:
        argv = [*_unshare_prefix(upper=self.work_dir / "etc-upper",
                                 work=self.work_dir / "etc-work"),
                str(home / "kueue"), f"--config={self.config_path}",
                f"--kubeconfig={self.cluster.kubeconfig}"]
        comp = Component(name="kueue", argv=argv, log_path=self.cluster.log_dir / "kueue.log")
        self.component = comp
        self.cluster.components["kueue"] = comp  # failure reports show its log; stop() ends it
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig),
                   POD_NAMESPACE=self.namespace)
        comp.start(env=env)

    async def _readyz(self) -> bool:
        async with httpx.AsyncClient(timeout=2.0) as http:
            resp = await http.get(f"http://127.0.0.1:{self.health_port}/readyz")
            return resp.status_code == 200

    async def _until(self, what: str, probe: Callable[[], Awaitable[bool]],
                     deadline: float) -> None:
        last = ""
        while True:
            comp = self.component
            if comp is not None and comp.process is not None and not comp.alive():
                raise KueueError(f"Kueue did not come up: the manager exited with "
                                 f"{comp.process.returncode} while waiting for {what}; its last "
                                 f"log lines:\n{comp.tail(40)}")
            try:
                if await probe():
                    return
                last = "not yet"
            except (APIError, httpx.HTTPError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise KueueError(f"Kueue did not come up: timed out waiting for {what} (last: "
                                 f"{last[:500]}); the manager's last log lines:\n{self.tail()}")
            await asyncio.sleep(0.25)


def _check_unshare() -> None:
    if shutil.which("unshare") is None:
        raise KueueError("Kueue needs `unshare` (util-linux) to give it /etc/kueue/metrics/certs "
                         "in a private mount namespace")
    done = subprocess.run([*_unshare(), "--", "true"], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise KueueError("Kueue needs a private mount namespace (for the metrics certificate it "
                         f"reads from /etc/kueue/metrics/certs), and `unshare` failed: "
                         f"{done.stderr.strip()}")


async def _ensure_namespace(kube: KubeClient, name: str) -> None:
    with contextlib.suppress(ConflictError):
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name}})


async def _apply(kube: KubeClient, collection: str, obj: dict[str, Any]) -> None:
    """Create, or replace what is there (a restart moves the webhook port)."""
    try:
        await kube.create(collection, obj)
    except ConflictError:
        path = f"{collection}/{obj['metadata']['name']}"
        current = await kube.get(path)
        body = copy.deepcopy(obj)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await kube.request("PUT", path, body=body)


async def _established(kube: KubeClient, names: list[str]) -> bool:
    for name in names:
        crd = await kube.get(f"{CRD_PATH}/{name}")
        conds = (crd.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            return False
    return True


def _probe_cq(*, version: str = "v1beta2", nominal: str = "1") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{version}", "kind": "ClusterQueue",
            "metadata": {"name": "vkp-kueue-probe"},
            "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                {"name": "vkp-kueue-probe", "resources": [
                    {"name": "cpu", "nominalQuota": nominal}]}]}]}}


async def _mutated(kube: KubeClient, plural: str) -> bool:
    if plural == "clusterqueues":
        body = _probe_cq()
    else:
        body = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "vkp-kueue-probe"}}
    made = await kube.request("POST", f"{API}/{plural}", params={"dryRun": "All"}, body=body,
                              retry=False)
    return FINALIZER in (made.get("metadata") or {}).get("finalizers", [])


async def _refused(kube: KubeClient) -> bool:
    """A negative quota passes the CRD schema; only Kueue's validating webhook refuses it."""
    try:
        await kube.request("POST", f"{API}/clusterqueues", params={"dryRun": "All"},
                           body=_probe_cq(nominal="-1"), retry=False)
    except APIError as exc:
        if 'admission webhook "vclusterqueue.kb.io" denied' in str(exc):
            return True
        raise
    return False


async def _converted(kube: KubeClient) -> bool:
    made = await kube.request("POST", f"/apis/{GROUP}/v1beta1/clusterqueues",
                              params={"dryRun": "All"}, body=_probe_cq(version="v1beta1"),
                              retry=False)
    return made.get("apiVersion") == f"{GROUP}/v1beta1"


# ---- pytest ---------------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    """``from vkprovider.testing.kueue import kueue``: the session fixture, from
    :mod:`vkprovider.testing.kueuefixture`. Imported only when asked for, so that this module
    (and ``vkprovider demo``, ``dev up --kueue``) needs no pytest: the image ships none."""
    if name == "kueue":
        from vkprovider.testing.kueuefixture import kueue

        return kueue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
