"""Command-line entry points: ``vkprovider <command>``.

Why it exists: one package and one image serve every process (virtual kubelet, companion, mock
cloud, local development); the command picks which. Parsing stays here, the work lives in the
modules each command calls.

What a user typed wrong is reported here, before any work starts, as exactly one line on stderr
that names it, with exit status 2 and no traceback: a bad flag value (``--log-level``, a port, an
interval), a settings file that does not parse or validate (naming the field), a missing or
malformed kubeconfig (naming the path). ``--log-level``/``--log-format``/``--kubeconfig`` are
accepted before or after the command. ``run`` and ``descheduler`` then check that the API server
answers, for at most ``api_server_timeout_seconds``; if it never does they exit 1 with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vkprovider import __version__, cliflags, eventloop, logs
from vkprovider.errors import APIServerUnreachable, ConfigError, one_line
from vkprovider.memtune import without_http2_client

log = logging.getLogger(__name__)

DESCRIPTION = ("vkprovider: a Virtual Kubelet provider that bursts Kubernetes GPU pods onto "
               "external GPU clouds, and its companion controller. Run "
               "'vkprovider COMMAND --help' for a command's flags.")
PROBE_TIMEOUT = 10.0  # seconds one reachability probe may take


# -- commands --------------------------------------------------------------------------------


def _dev_up(args: argparse.Namespace) -> int:
    from vkprovider.devenv import DEFAULT_INVENTORY, DevOptions, run_dev_up

    inventory = args.inventory or DEFAULT_INVENTORY
    parse_inventory(inventory)  # a bad entry is one line, before anything starts
    out = Path(args.kubeconfig_out).expanduser() if args.kubeconfig_out else None
    if out is not None and out.is_dir():
        raise ConfigError(f"--kubeconfig-out {args.kubeconfig_out}: is a directory")
    options = DevOptions(gpu_nodes=args.gpu_nodes, gpus_per_node=args.gpus,
                         cluster_only=args.cluster_only, kubeconfig_out=out, inventory=inventory,
                         kueue=args.kueue, real_node=args.real_node)
    return asyncio.run(run_dev_up(options=options))


def _api_problem(exc: Exception, *, host: str, namespace: str, service: str) -> str:
    """What went wrong reading a Service and its EndpointSlices, in one line for a user."""
    from vkprovider.kube.errors import (
        ConnectionFailed,
        ForbiddenError,
        NotFoundError,
        UnauthorizedError,
    )

    if isinstance(exc, ConnectionFailed):
        return (f"the API server at {host} did not answer ({exc}); is 'vkprovider dev up' still "
                f"running, and KUBECONFIG (or --kubeconfig) its kubeconfig?")
    if isinstance(exc, NotFoundError):
        return (f"no Service {service} in namespace {namespace} "
                f"(kubectl -n {namespace} get services)")
    if isinstance(exc, ForbiddenError):
        return (f"the API server at {host} refused to show Service {namespace}/{service} or its "
                f"EndpointSlices to these credentials (403 Forbidden): {exc}")
    if isinstance(exc, UnauthorizedError):
        return f"the API server at {host} rejected the credentials (401 Unauthorized)"
    return f"the API server at {host} answered {exc}"


def _recorded_address_map(kubeconfig: str | None) -> str | None:
    """The address map ``dev up --kubeconfig-out`` recorded in the kubeconfig in use."""
    from vkprovider.devenv import address_map_of

    paths = [kubeconfig] if kubeconfig else [
        p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for path in paths:
        found = address_map_of(Path(path).expanduser())
        if found:
            return found
    return None


def _dev_curl(args: argparse.Namespace) -> int:
    from vkprovider.devcurl import DevCurlError, address_map_dir, curl_service, parse_target
    from vkprovider.kube import startup
    from vkprovider.kube.errors import APIError

    target = parse_target(args.target)  # what was typed wrong: one line, exit 2
    network = address_map_dir(flag=args.address_map,
                              env=os.environ.get("VKP_ADDRESS_MAP") or _recorded_address_map(
                                  args.kubeconfig))
    client = startup.kube_client(kubeconfig=args.kubeconfig, source="--kubeconfig",
                          user_agent=f"vkprovider-dev-curl/{__version__}")

    async def curl() -> int:
        async with client:
            try:
                answer = await curl_service(kube=client, target=target, address_map=network,
                                            timeout=args.timeout)
            except (DevCurlError, APIError) as exc:
                why = exc if isinstance(exc, DevCurlError) else _api_problem(
                    exc, host=client.host, namespace=target.namespace, service=target.service)
                sys.stderr.write(f"vkprovider dev curl: error: {one_line(str(why))}\n")
                return 1
        sys.stderr.write(f"{answer.status} from {answer.endpoint} (via {answer.via})\n")
        sys.stdout.write(answer.body if answer.body.endswith("\n") or not answer.body
                         else answer.body + "\n")
        sys.stdout.flush()
        return 0 if 200 <= answer.status < 300 else 1

    return asyncio.run(curl())


def tune_memory() -> None:
    """Rarer full GC passes (kube/gcpause.py); freed memory handed back (memtune.py)."""
    from vkprovider.kube.gcpause import tune
    from vkprovider.memtune import tune_malloc

    tune()
    tune_malloc()


def _run(args: argparse.Namespace) -> int:
    without_http2_client()  # before anything imports httpcore (memtune.py says why)
    from vkprovider.api.tls import self_signed_files, server_context
    from vkprovider.config import Settings, load_model
    from vkprovider.kube import startup
    from vkprovider.service import run_virtual_kubelet

    overrides: dict[str, Any] = {"kubeconfig": args.kubeconfig,
                                 "api_server_timeout_seconds": args.api_server_timeout,
                                 "event_loop": args.event_loop}
    settings = load_model(Settings, args.config, overrides=overrides)
    ip = os.environ.get("VKP_NODE_INTERNAL_IP")
    if ip:
        settings = settings.model_copy(
            update={"node": settings.node.model_copy(update={"internal_ip": ip})})
    node = settings.node
    hosts = (node.name, node.internal_ip, "localhost", "127.0.0.1")
    generated = None
    if not settings.tls_cert_file and not settings.tls_key_file:
        # written now (and only to kubelet_api.cert_dir or $TMPDIR), served from files
        generated = self_signed_files(cert_dir=settings.kubelet_api.cert_dir,
                                      common_name=node.name, hosts=hosts)
        settings = settings.model_copy(update={"tls_cert_file": generated.cert_file,
                                               "tls_key_file": generated.key_file})
    try:
        # a bad certificate or client CA fails now, also on a standby
        server_context(cert_file=settings.tls_cert_file, key_file=settings.tls_key_file,
                       client_ca_file=settings.kubelet_api.client_ca_file,
                       common_name=node.name, hosts=hosts)
        source = "--kubeconfig" if args.kubeconfig else f"{args.config}: kubeconfig"
        client = startup.kube_client(kubeconfig=settings.kubeconfig, source=source,
                              user_agent=f"vkprovider/{__version__}")
        named = startup.credentials_name(kubeconfig=settings.kubeconfig, source=source)
        tune_memory()
        return eventloop.run(startup.checked_start(
            client=client, timeout=settings.api_server_timeout_seconds, named=named,
            start=lambda: run_virtual_kubelet(settings=settings)), choice=settings.event_loop)
    finally:
        if generated is not None:
            generated.remove()


def parse_inventory(text: str) -> list[tuple[str, str, int, float]]:
    """``TYPE:REGION:COUNT:PRICE[,...]`` -> offers; errors name the bad entry."""
    offers = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        parts = entry.split(":")
        try:
            gpu_type, region, count, price = parts
            offers.append((gpu_type, region, int(count), float(price)))
        except ValueError:
            raise ConfigError(
                f"--inventory: {entry!r} is not TYPE:REGION:COUNT:PRICE (e.g. H100:us-east:16:2.49)"
            ) from None
    return offers


def _mock_cloud(args: argparse.Namespace) -> int:
    from providers.mock.scenario import ScenarioError, load_scenario
    from providers.mock.server import DEFAULT_INVENTORY, InventoryOffer, MockCloudState, serve

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if not args.name or "/" in args.name or args.name.startswith("."):
        raise ConfigError(f"--name: {args.name!r} is not a plain name (it names a file)")
    scenario = None
    if args.scenario:
        try:
            scenario = load_scenario(args.scenario)
        except ScenarioError as exc:
            raise ConfigError(f"--scenario: {exc}") from None
        # flags given on the command line win over the scenario file
        update = {k: v for k, v in (("boot_delay", args.boot_delay), ("seed", args.seed),
                                    ("delete_delay", args.delete_delay)) if v is not None}
        if args.inventory:
            update["inventory"] = None
        scenario = scenario.model_copy(update=update)
    inventory = DEFAULT_INVENTORY
    if args.inventory:
        inventory = tuple(
            InventoryOffer(gpu_type=t, region=r, count=c, price_per_gpu_hour=p)
            for t, r, c, p in parse_inventory(args.inventory)
        )
    state = MockCloudState(
        api_key=api_key, inventory=inventory, scenario=scenario,
        boot_delay=1.0 if args.boot_delay is None else args.boot_delay,
        delete_delay=0.0 if args.delete_delay is None else args.delete_delay,
        seed=0 if args.seed is None else args.seed, name=args.name,
        public_block=args.public_block, edge=_mock_edge(args, api_key))
    eventloop.run(serve(host=args.host, port=args.port, state=state, log_level="warning",
                        announce=_announce, address_map_dir=args.address_map_dir),
                  choice=args.event_loop, named="--event-loop")
    return 0


def _mock_edge(args: argparse.Namespace, api_key: str | None) -> Any:
    """Hostname-only mode from ``--edge-*`` (providers/mock/edge.py), or None."""
    from providers.mock.edge import EdgeSettings

    if not args.edge_domain:
        if (args.edge_cert or args.edge_key or args.edge_auth_header
                or args.edge_timeout is not None or args.edge_http1_only):
            raise ConfigError("--edge-cert/--edge-key/--edge-auth-header/--edge-timeout/"
                              "--edge-http1-only need --edge-domain")
        return None
    if not args.edge_cert or not args.edge_key:
        raise ConfigError("--edge-domain needs --edge-cert and --edge-key (PEM files)")
    if args.edge_auth_header and not api_key:
        raise ConfigError("--edge-auth-header needs --api-key-env (the edge wants that key)")
    try:
        return EdgeSettings(domain=args.edge_domain, cert_file=Path(args.edge_cert),
                            key_file=Path(args.edge_key), auth_header=args.edge_auth_header,
                            api_key=api_key if args.edge_auth_header else None,
                            http2=not args.edge_http1_only,
                            **({} if args.edge_timeout is None
                               else {"timeout_seconds": args.edge_timeout}))
    except ValueError as exc:
        raise ConfigError(f"--edge-*: {exc}") from None


def _announce(line: str) -> None:
    """The mock cloud's start-up line, on stdout (flushed: it may go to a log file or a pipe)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _check_port_free(port: int, *, named: str) -> None:
    """A port the companion will listen on (all interfaces) must be free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            raise ConfigError(f"{named} {port}: cannot listen: {exc.strerror}") from exc


def _one_or_many(names: list[str]) -> str | list[str]:
    return names[0] if len(names) == 1 else names


def _descheduler(args: argparse.Namespace) -> int:
    without_http2_client()  # before anything imports httpcore (memtune.py says why)
    from vkprovider.config import load_companion_settings
    from vkprovider.descheduler.service import run_companion
    from vkprovider.kube import startup

    leader: dict[str, Any] = {"enabled": args.leader_elect, "namespace": args.leader_namespace}
    overrides: dict[str, Any] = {  # flags given win over the file; None: not given
        "kubeconfig": args.kubeconfig,
        "node_name": None if not args.node_name else (
            args.node_name[0] if len(args.node_name) == 1 else tuple(args.node_name)),
        "interval_seconds": args.interval, "move_back_interval_seconds": args.move_back_interval,
        "headroom_gpus": args.headroom_gpus, "metrics_port": args.metrics_port,
        "api_server_timeout_seconds": args.api_server_timeout, "leader_election": leader,
        "preemption_fast_path": args.preemption_fast_path,
        "gpu_health_taints": tuple(args.gpu_health_taint) if args.gpu_health_taint else None,
        "event_loop": args.event_loop,
        "policy_labels": dict(args.policy_label) if args.policy_label else None,
    }
    settings = load_companion_settings(args.config, overrides=overrides)
    if settings.metrics_port:
        named = "--metrics-port" if args.metrics_port is not None else "metrics_port"
        _check_port_free(settings.metrics_port, named=named)
    from_file = args.kubeconfig is None and args.config is not None
    source = f"{args.config}: kubeconfig" if from_file else "--kubeconfig"
    client = startup.kube_client(kubeconfig=settings.kubeconfig, source=source,
                          user_agent=f"vkprovider-companion/{__version__}")
    named = startup.credentials_name(kubeconfig=settings.kubeconfig, source=source)
    tune_memory()
    return eventloop.run(startup.checked_start(
        client=client, timeout=settings.api_server_timeout_seconds, named=named,
        start=lambda: run_companion(
            kubeconfig=settings.kubeconfig, node_name=_one_or_many(settings.node_names()),
            interval=settings.interval_seconds,
            move_back_interval=settings.move_back_interval_seconds,
            headroom_gpus=settings.headroom_gpus, metrics_port=settings.metrics_port,
            leader_elect=settings.leader_election.enabled,
            leader_namespace=settings.leader_election.namespace,
            preemption_fast_path=settings.preemption_fast_path,
            gpu_health_taints=settings.gpu_health_taints,
            policy_labels=settings.policy_labels)), choice=settings.event_loop)


def _decommission(args: argparse.Namespace) -> int:
    from vkprovider.config import Settings, load_model
    from vkprovider.decommission import run_decommission
    from vkprovider.kube import startup

    settings = load_model(Settings, args.config, overrides={
        "kubeconfig": args.kubeconfig, "api_server_timeout_seconds": args.api_server_timeout})
    source = "--kubeconfig" if args.kubeconfig else f"{args.config}: kubeconfig"
    client = startup.kube_client(kubeconfig=settings.kubeconfig, source=source,
                          user_agent=f"vkprovider-decommission/{__version__}")
    named = startup.credentials_name(kubeconfig=settings.kubeconfig, source=source)
    return asyncio.run(startup.checked_start(
        client=client, timeout=settings.api_server_timeout_seconds, named=named,
        start=lambda: run_decommission(settings=settings, timeout=args.timeout,
                                       provider_grace=args.provider_grace, out=sys.stdout)))


def _demo(args: argparse.Namespace) -> int:
    from vkprovider.demo import run_demo
    from vkprovider.testing.cluster import ControlPlaneError

    try:
        if args.real_node:
            from vkprovider.realdemo import run_real_demo

            return asyncio.run(run_real_demo(keep=args.keep, kueue=args.kueue))
        return asyncio.run(run_demo(keep=args.keep, kueue=args.kueue))
    except ControlPlaneError as exc:  # e.g. in the image: no Go-built control plane
        sys.stderr.write(f"vkprovider demo: error: {one_line(str(exc))} (the demo runs from a "
                         f"checkout: `make demo` builds what it needs)\n")
        return 1


def _gateway_config(args: argparse.Namespace) -> int:
    """Print the gateway's HAProxy configuration for the provider's ``gateway:`` settings."""
    from vkprovider.config import Settings, load_model
    from vkprovider.gateway.haproxycfg import GatewayLayout, RuntimeTLS, render, write

    g = load_model(Settings, args.config).gateway
    tls = None
    if args.runtime_bind:
        if not args.runtime_pem or not args.runtime_client_ca:
            raise ConfigError("--runtime-bind needs --runtime-pem and --runtime-client-ca")
        tls = RuntimeTLS(bind=args.runtime_bind, server_pem=Path(args.runtime_pem),
                         client_ca=Path(args.runtime_client_ca))
    try:
        layout = GatewayLayout(bind_host=args.bind, first_port=g.first_port, count=g.port_count,
                               socket=Path(args.socket), ca_file=Path(g.ca_file),
                               map_dir=Path(g.map_dir), auth_headers=g.auth_headers,
                               runtime_tls=tls, health_bind=args.health_bind)
    except ValueError as exc:
        raise ConfigError(f"gateway: {exc}") from None
    if args.output:  # the file, and the empty map files it loads (a pod's init container)
        write(layout, Path(args.output))
    else:
        sys.stdout.write(render(layout))
    return 0


def _without_command(args: argparse.Namespace) -> int:
    sys.stderr.write("vkprovider: error: name a command: run, mock-cloud, gateway-config, "
                     "descheduler, demo or dev (vkprovider --help)\n")
    return 2


def _dev_without_command(args: argparse.Namespace) -> int:
    sys.stderr.write("vkprovider dev: error: name a command: up or curl "
                     "(vkprovider dev --help)\n")
    return 2


# -- the parser ------------------------------------------------------------------------------


def _global_flags(*, kubeconfig: bool) -> cliflags.Parser:
    """The flags accepted before and after the command (defaults are applied in :func:`main`)."""
    flags = cliflags.Parser(add_help=False)
    flags.add_argument("--log-level", type=cliflags.log_level, default=argparse.SUPPRESS,
                       help="debug, info (default), warning, error or critical")
    flags.add_argument("--log-format", choices=("json", "text"), default=argparse.SUPPRESS,
                       help="text (default; with timestamps) or json (one object per line)")
    if kubeconfig:
        flags.add_argument("--kubeconfig", default=argparse.SUPPRESS,
                           help="default: in-cluster, else $KUBECONFIG or ~/.kube/config")
    return flags


def build_parser() -> argparse.ArgumentParser:
    with_kube, without_kube = _global_flags(kubeconfig=True), _global_flags(kubeconfig=False)
    parser = cliflags.Parser(prog="vkprovider", description=DESCRIPTION, parents=[with_kube])
    parser.add_argument("--version", action="version", version=f"vkprovider {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.set_defaults(func=_without_command)

    run = sub.add_parser("run", help="run the virtual kubelet (one virtual node)",
                         parents=[with_kube])
    run.add_argument("--config", required=True, help="settings YAML (see docs/configuration.md)")
    run.add_argument("--api-server-timeout", type=cliflags.positive_seconds,
                     help="seconds to wait for the API server at start, then exit 1 "
                          "(default: the file's api_server_timeout_seconds, else 60)")
    run.add_argument("--event-loop", choices=eventloop.CHOICES,
                     help="auto: uvloop when installed; uvloop; asyncio "
                          "(default: the file's event_loop, else auto)")
    run.set_defaults(func=_run, takes_kubeconfig=True)

    mock = sub.add_parser("mock-cloud", help="run the mock GPU cloud (tests, demos, your CI)",
                          parents=[without_kube])
    mock.add_argument("--host", default="127.0.0.1")
    mock.add_argument("--port", type=cliflags.port_type(allow_zero=False), default=8080)
    mock.add_argument("--boot-delay", type=cliflags.non_negative_seconds,
                      help="seconds pending -> running (default: the scenario's, else 1.0)")
    mock.add_argument("--delete-delay", type=cliflags.non_negative_seconds,
                      help="seconds terminating -> gone (default: the scenario's, else 0)")
    mock.add_argument("--api-key-env", help="require this env var's value as the API key")
    mock.add_argument("--seed", type=cliflags.any_integer,
                      help="default: the scenario's, else 0")
    mock.add_argument("--inventory", help="TYPE:REGION:COUNT:PRICE[,...]; default: the "
                      "scenario's, else a small mix")
    mock.add_argument("--scenario", help="scenario YAML: inventory, delays, seed, faults "
                      "(docs/testing-with-the-mock-cloud.md); flags given here win")
    mock.add_argument("--address-map-dir", metavar="DIR",
                      help="publish the routes to the instances' real listeners in this "
                           "address map directory (as mock-NAME.json), for a lab network")
    mock.add_argument("--public-block", type=int, default=0, choices=range(16),
                      metavar="0-15", help="which of 16 public address blocks (in "
                      "198.18.0.0/15) this cloud's instances get; give each cloud on one lab "
                      "network its own (default: 0)")
    mock.add_argument("--name", default="mock",
                      help="this cloud's name in the address map (default: mock)")
    mock.add_argument("--event-loop", choices=eventloop.CHOICES, default="auto",
                      help="auto: uvloop when installed (default); uvloop; asyncio")
    mock.add_argument("--edge-domain", metavar="DOMAIN",
                      help="hostname-only mode: each container port is reached only at "
                           "https://<instance>-<port>.DOMAIN:443 (like SaladCloud's access "
                           "domains, RunPod's proxy), no IP mapping")
    mock.add_argument("--edge-cert", metavar="PEM", help="the edge's certificate (a wildcard "
                      "for DOMAIN, chain included)")
    mock.add_argument("--edge-key", metavar="PEM", help="the edge certificate's private key")
    mock.add_argument("--edge-auth-header", metavar="NAME",
                      help="the edge answers 401 unless this header carries the API key "
                           "(--api-key-env), like SaladCloud's Salad-Api-Key")
    mock.add_argument("--edge-timeout", metavar="SECONDS", type=float, default=None,
                      help="the edge answers 524 to a request whose response has not started "
                           "within SECONDS, like RunPod's proxy (default: 100)")
    mock.add_argument("--edge-http1-only", action="store_true",
                      help="the edge offers only HTTP/1.1 by ALPN (default: h2 and http/1.1, "
                           "as a real edge; gRPC needs h2)")
    mock.set_defaults(func=_mock_cloud)

    gwc = sub.add_parser("gateway-config", parents=[without_kube],
                         help="print the traffic gateway's HAProxy configuration (traffic.md)")
    gwc.add_argument("--config", required=True, help="the provider's settings YAML (its "
                     "gateway: block gives the ports, CA, maps and auth headers)")
    gwc.add_argument("--bind", default="0.0.0.0", help="the listeners' address (default: all)")
    gwc.add_argument("--socket", default="/var/run/haproxy/runtime.sock",
                     help="the Runtime API's Unix socket (admin level, mode 600)")
    gwc.add_argument("--runtime-bind", metavar="HOST:PORT", help="also offer the Runtime API "
                     "there, mutual TLS only (for a provider in another pod)")
    gwc.add_argument("--runtime-pem", metavar="PEM", help="the gateway's certificate and key")
    gwc.add_argument("--runtime-client-ca", metavar="PEM",
                     help="the CA whose client certificates (the provider's) may connect")
    gwc.add_argument("--health-bind", metavar="HOST:PORT", help="serve /healthz (probes) and "
                     "/metrics (HAProxy's Prometheus exporter) there")
    gwc.add_argument("--output", metavar="FILE", help="write the configuration there and create "
                     "the empty map files it loads (default: print it)")
    gwc.set_defaults(func=_gateway_config)

    comp = sub.add_parser("descheduler", help="run the companion: overflow admission by policy",
                          parents=[with_kube])
    comp.add_argument("--config", help="companion settings YAML (docs/configuration.md); "
                      "flags given here win over it")
    comp.add_argument("--node-name", action="append",
                      help="the virtual node's name (default: vk-gpu-burst); repeat it to "
                           "serve several virtual nodes")
    comp.add_argument("--interval", type=cliflags.positive_seconds,
                      help="seconds between admission passes (default: 2)")
    comp.add_argument("--move-back-interval", type=cliflags.positive_seconds,
                      help="seconds between move-back passes (default: 30)")
    comp.add_argument("--headroom-gpus", type=cliflags.count,
                      help="GPUs to keep free inside when judging whether a pod fits (default 0)")
    comp.add_argument("--gpu-health-taint", action="append", metavar="KEY[=VALUE][:EFFECT]",
                      help="a node taint that takes its GPUs out of service (repeat it; replaces "
                           "the defaults: AggregatedNodeHealth, GPUHealth, "
                           "node.kubernetes.io/out-of-service)")
    comp.add_argument("--metrics-port", type=cliflags.port_type(allow_zero=True),
                      help="Prometheus port; 0: off (default)")
    comp.add_argument("--policy-label", action="append", type=cliflags.label_pair,
                      metavar="KEY=VALUE", help="act only on OverflowPolicies with this label "
                      "(repeat it: all of them; the providers' pods.policy_labels; default: "
                      "every policy)")
    comp.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                      help="Lease-based leader election (run two replicas for HA)")
    comp.add_argument("--leader-namespace", help="default: vkprovider-system")
    comp.add_argument("--preemption-fast-path", action=argparse.BooleanOptionalAction,
                      default=None, help="admit the replacement of a replica the scheduler "
                      "preempted without waiting overflowAfter (default: on)")
    comp.add_argument("--api-server-timeout", type=cliflags.positive_seconds,
                      help="seconds to wait for the API server at start, then exit 1 "
                           "(default: 60)")
    comp.add_argument("--event-loop", choices=eventloop.CHOICES,
                      help="auto: uvloop when installed (default); uvloop; asyncio")
    comp.set_defaults(func=_descheduler, takes_kubeconfig=True)

    dec = sub.add_parser(
        "decommission", parents=[with_kube],
        help="take the virtual node of a settings file out of service before uninstalling: "
             "cordon it, delete its pods, wait until every cloud account lists no instance of "
             "it (deleting them directly if the provider is not running), delete the Node; "
             "exit 1 naming what remains if --timeout passes first")
    dec.add_argument("--config", required=True,
                     help="the provider's settings YAML (its node name and cloud accounts)")
    dec.add_argument("--timeout", type=cliflags.positive_seconds, default=300.0,
                     help="seconds to wait for every account to list no instance (default 300)")
    dec.add_argument("--provider-grace", type=cliflags.non_negative_seconds, default=120.0,
                     help="seconds a running provider gets to delete the instances itself "
                          "before they are deleted directly (default 120)")
    dec.add_argument("--api-server-timeout", type=cliflags.positive_seconds,
                     help="seconds to wait for the API server at start, then exit 1 "
                          "(default: the file's api_server_timeout_seconds, else 60)")
    dec.set_defaults(func=_decommission, takes_kubeconfig=True)

    demo = sub.add_parser("demo", help="play the burst story on a local cluster, narrated",
                          parents=[without_kube])
    demo.add_argument("--keep", action="store_true", help="keep everything running at the end")
    demo.add_argument("--kueue", action=argparse.BooleanOptionalAction, default=None,
                      help="the way out through real Kueue with the pre-warm AdmissionCheck "
                           "(needs VKP_KUEUE_BIN=$(bash tools/kueue/build.sh)); --no-kueue: by "
                           "plain preemption, the measured baseline (default: Kueue when "
                           "VKP_KUEUE_BIN names a build, else plain preemption, saying so)")
    demo.add_argument("--real-node", action="store_true",
                      help="play it on a real node (kubelet, containerd, kube-proxy; as root), "
                           "its traffic over kube-proxy, counted by a client pod (--kueue and "
                           "--no-kueue choose its way out as above)")
    demo.set_defaults(func=_demo)

    dev = sub.add_parser("dev", help="local development helpers", parents=[without_kube])
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="COMMAND")
    dev.set_defaults(func=_dev_without_command)
    up = dev_sub.add_parser(
        "up", parents=[without_kube],
        help="the whole system on this machine: a local control plane with simulated GPU "
             "nodes, the CRDs and RBAC, a mock cloud, the provider and the companion; "
             "Ctrl-C stops everything")
    up.add_argument("--gpu-nodes", type=cliflags.count, default=2,
                    help="simulated internal GPU nodes (default 2)")
    up.add_argument("--gpus", type=cliflags.positive_count, default=4,
                    help="GPUs per simulated node (default 4)")
    up.add_argument("--cluster-only", action="store_true",
                    help="only the control plane, the GPU nodes, the CRDs and RBAC: no mock "
                         "cloud, provider or companion (to run them yourself)")
    up.add_argument("--kubeconfig-out", metavar="PATH",
                    help="also write the admin kubeconfig here once everything is ready "
                         "(removed at exit)")
    up.add_argument("--inventory", help="the mock cloud's offers, TYPE:REGION:COUNT:PRICE[,...] "
                    "(default: 8 H100 in us-east and in eu-west, 8 A100 in us-east)")
    up.add_argument("--kueue", action="store_true",
                    help="also run real Kueue v0.17.0 (its CRDs, the manager, its webhooks on "
                         "loopback); needs VKP_KUEUE_BIN=$(bash tools/kueue/build.sh)")
    up.add_argument("--real-node", action="store_true",
                    help="also join a real worker node (containerd, kubelet, kube-proxy in a "
                         "network namespace of its own; as root), to run real pods beside the "
                         "virtual node; Ctrl-C removes it too")
    up.set_defaults(func=_dev_up)
    curl = dev_sub.add_parser(
        "curl", parents=[with_kube],
        help="GET a path from a Service on dev up's lab network: a ready endpoint of its "
             "EndpointSlices, dialled through the address map (virtual addresses are not "
             "routed); the body on stdout, exit 0 on a 2xx answer")
    curl.add_argument("target", metavar="NS/SERVICE[:PORT][/PATH]",
                      help="e.g. serving/inference/ or dev/llm:web/healthz (PORT: the Service "
                           "port's name or number; default its only port)")
    curl.add_argument("--address-map", metavar="DIR",
                      help="the lab network's address map (default: $VKP_ADDRESS_MAP, which "
                           "dev up prints, else the one dev up --kubeconfig-out recorded in "
                           "the kubeconfig)")
    curl.add_argument("--timeout", type=cliflags.positive_seconds, default=10.0,
                      help="seconds the request may take (default 10)")
    curl.set_defaults(func=_dev_curl, takes_kubeconfig=True)
    return parser


def _config_error(exc: BaseException) -> ConfigError | None:
    """The :class:`ConfigError` behind ``exc`` (also inside a TaskGroup's exception group)."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _config_error(inner)
            if found is not None:
                return found
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "kubeconfig", None) is not None and not getattr(args, "takes_kubeconfig",
                                                                    False):
        parser.error(f"argument --kubeconfig: not used by {args.command}")
    for name in ("kubeconfig", "log_level", "log_format"):
        if not hasattr(args, name):
            setattr(args, name, {"log_level": "INFO", "log_format": "text"}.get(name))
    logs.setup(level=args.log_level, fmt=args.log_format)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except APIServerUnreachable as exc:
        sys.stderr.write(f"vkprovider: error: {one_line(str(exc))}\n")
        return 1
    except BaseException as exc:
        found = _config_error(exc)
        if found is None:
            raise
        sys.stderr.write(f"vkprovider: error: {one_line(str(found))}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
