"""The chart's traffic gateway (gateway.enabled): a Deployment of HAProxy the provider programs.

Why it exists: the gateway's pods must be what the provider expects to find (its label selector,
Runtime API port, mutual TLS files) and run as the restricted Pod Security level asks; the
HAProxy configuration their init container writes must be one HAProxy accepts. Rendered with
the real helm (tests/unit/test_chart_parity.py's), the settings loaded by the service's own
loader, and the init container's command run for real with its paths moved into a tmp dir.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_chart_parity import CHART, deployment, helm, settings_files, template
from vkprovider.cli import main
from vkprovider.testing.pki import CertificateAuthority

pytestmark = pytest.mark.timeout(900)  # a cold build of helm

ON = ("gateway.enabled=true", "gateway.runtimeTLSSecret=gw-runtime-tls")


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_gateway_is_off_by_default_and_needs_its_runtime_secret() -> None:
    assert not [o for o in template()
                if o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                == "gateway"]
    done = subprocess.run([str(helm()), "template", "r", str(CHART), "--set",
                           "gateway.enabled=true"], capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "gateway.runtimeTLSSecret" in done.stderr


def test_gateway_deployment_pdb_probes_restricted_and_found_by_the_provider(
        tmp_path: Path) -> None:
    objs = template(*ON)
    gw = deployment(objs, "gateway")
    spec = gw["spec"]["template"]["spec"]
    assert gw["spec"]["replicas"] == 2
    [pdb] = [o for o in objs if o["kind"] == "PodDisruptionBudget"
             and o["metadata"]["name"] == gw["metadata"]["name"]]
    assert pdb["spec"]["selector"] == gw["spec"]["selector"] and pdb["spec"]["minAvailable"] == 1
    [haproxy] = spec["containers"]
    assert haproxy["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert haproxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    for c in [haproxy, *spec["initContainers"]]:  # the restricted Pod Security level
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and isinstance(sc["runAsUser"], int)
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    # a deleted gateway pod serves on (preStop sleep) while its replicas are re-homed
    assert haproxy["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}
    assert spec["terminationGracePeriodSeconds"] > 10
    assert haproxy["image"] == "ghcr.io/vkprovider/vkprovider-gateway:" + chart_version()

    settings, _ = settings_files(objs, tmp_path)
    g = settings.gateway
    assert g.enabled and g.pods is not None and g.runtime_tls is not None
    labels = gw["spec"]["template"]["metadata"]["labels"]
    selector = dict(item.split("=", 1) for item in g.pods.selector.split(","))
    assert all(labels[k] == v for k, v in selector.items())  # the provider finds these pods
    ports = {p["name"]: p["containerPort"] for p in haproxy["ports"]}
    assert ports["runtime"] == g.pods.runtime_port
    provider = deployment(objs, "virtual-kubelet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in provider["containers"][0]["volumeMounts"]}
    assert Path(g.runtime_tls.cert_file).parent == Path(mounts["gateway-tls"])
    volumes = {v["name"]: v for v in provider["volumes"]}
    assert volumes["gateway-tls"]["secret"]["secretName"] == "gw-runtime-tls"


def test_the_init_containers_command_writes_a_configuration_haproxy_accepts(
        tmp_path: Path) -> None:
    objs = template(*ON)
    spec = deployment(objs, "gateway")["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    settings, _ = settings_files(objs, tmp_path)
    # the pod's paths, moved under tmp_path: the config, its maps, the CA, the TLS files
    (tmp_path / "pki").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "pki", name="runtime-ca")
    pair = ca.issue(stem="tls", common_name="vkprovider-gateway", server=True, client=True,
                    hosts=("vkprovider-gateway",))
    tls = tmp_path / "gateway-tls"
    tls.mkdir()
    (tls / "tls.pem").write_bytes(pair.cert.read_bytes())  # the Secret's items, as mounted
    (tls / "tls.pem.key").write_bytes(pair.key.read_bytes())
    (tls / "ca.crt").write_bytes(ca.cert_path.read_bytes())
    run = tmp_path / "run"
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["gateway"]["map_dir"] = str(run / "maps")
    config["gateway"]["ca_file"] = str(ca.cert_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    args = [a.replace("/etc/vkprovider/config.yaml", str(tmp_path / "config.yaml"))
             .replace("/etc/vkprovider/gateway-tls", str(tls)).replace("/run/haproxy", str(run))
            for a in init["args"]]
    assert args[0].startswith("--log-format")
    run.mkdir()
    assert main(args[1:]) == 0
    assert settings.gateway.port_count == 256
    check = subprocess.run(["haproxy", "-c", "-f", str(run / "haproxy.cfg")],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    text = (run / "haproxy.cfg").read_text()
    assert "listen gw20000" in text and "listen gw20255" in text
    assert "verify required" in text.split("listen runtime-api")[1]


def test_gateway_network_policy_and_pod_monitor() -> None:
    objs = template(*ON, "networkPolicy.enabled=true", "serviceMonitor.enabled=true")
    gw = deployment(objs, "gateway")
    [np] = [o for o in objs if o["kind"] == "NetworkPolicy"
            and o["metadata"]["name"] == gw["metadata"]["name"]]
    assert np["spec"]["podSelector"] == gw["spec"]["selector"]
    by_port = {rule["ports"][0]["port"]: rule for rule in np["spec"]["ingress"]}
    listeners = by_port[20000]
    assert listeners["ports"][0]["endPort"] == 20255 and "from" not in listeners  # any client
    provider = deployment(objs, "virtual-kubelet")
    assert by_port[9999]["from"] == [{"podSelector": provider["spec"]["selector"]}]
    assert all("podSelector" in peer for peer in by_port[8404]["from"])  # metricsFrom, helm test
    [monitor] = [o for o in objs if o["kind"] == "PodMonitor"]
    assert monitor["spec"]["selector"] == gw["spec"]["selector"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("health", "/metrics")
    ports = {p["name"] for p in gw["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert "health" in ports
    assert {"targetLabel": "virtual_node", "replacement": "vk-gpu-burst"} in endpoint["relabelings"]
