"""Command-line entry points: ``vkprovider <command>``.

Why it exists: one package and one image serve every process (virtual kubelet, companion, mock
cloud, local development); the command picks which. Parsing stays here, the work lives in the
modules each command calls.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from vkprovider import logs
from vkprovider.errors import ConfigError


def _dev_up(args: argparse.Namespace) -> int:
    from vkprovider.devenv import run_dev_up

    return asyncio.run(run_dev_up(gpu_nodes=args.gpu_nodes, gpus_per_node=args.gpus))


def _run(args: argparse.Namespace) -> int:
    from vkprovider.config import load_settings
    from vkprovider.service import run_virtual_kubelet

    settings = load_settings(args.config, kubeconfig=args.kubeconfig)
    ip = os.environ.get("VKP_NODE_INTERNAL_IP")
    if ip:
        settings = settings.model_copy(
            update={"node": settings.node.model_copy(update={"internal_ip": ip})})
    return asyncio.run(run_virtual_kubelet(settings=settings))


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
        seed=0 if args.seed is None else args.seed)
    asyncio.run(serve(host=args.host, port=args.port, state=state, log_level="warning"))
    return 0


def _descheduler(args: argparse.Namespace) -> int:
    from vkprovider.descheduler.service import run_companion

    return asyncio.run(run_companion(
        kubeconfig=args.kubeconfig, node_name=args.node_name, interval=args.interval,
        move_back_interval=args.move_back_interval, headroom_gpus=args.headroom_gpus,
        metrics_port=args.metrics_port, leader_elect=args.leader_elect,
        leader_namespace=args.leader_namespace))


def _demo(args: argparse.Namespace) -> int:
    from vkprovider.demo import run_demo

    return asyncio.run(run_demo(keep=args.keep))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vkprovider", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("json", "text"), default="text")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the virtual kubelet (one virtual node)")
    run.add_argument("--config", required=True, help="settings YAML (see docs/configuration.md)")
    run.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    run.set_defaults(func=_run)

    mock = sub.add_parser("mock-cloud", help="run the mock GPU cloud (tests, demos, your CI)")
    mock.add_argument("--host", default="127.0.0.1")
    mock.add_argument("--port", type=int, default=8080)
    mock.add_argument("--boot-delay", type=float,
                      help="seconds pending -> running (default: the scenario's, else 1.0)")
    mock.add_argument("--delete-delay", type=float,
                      help="seconds terminating -> gone (default: the scenario's, else 0)")
    mock.add_argument("--api-key-env", help="require this env var's value as the API key")
    mock.add_argument("--seed", type=int, help="default: the scenario's, else 0")
    mock.add_argument("--inventory", help="TYPE:REGION:COUNT:PRICE[,...]; default: the "
                      "scenario's, else a small mix")
    mock.add_argument("--scenario", help="scenario YAML: inventory, delays, seed, faults "
                      "(docs/testing-with-the-mock-cloud.md); flags given here win")
    mock.set_defaults(func=_mock_cloud)

    comp = sub.add_parser("descheduler", help="run the companion: overflow admission by policy")
    comp.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    comp.add_argument("--node-name", default="vk-gpu-burst", help="the virtual node's name")
    comp.add_argument("--interval", type=float, default=2.0,
                      help="seconds between admission passes")
    comp.add_argument("--move-back-interval", type=float, default=30.0,
                      help="seconds between move-back passes")
    comp.add_argument("--headroom-gpus", type=int, default=0,
                      help="GPUs to keep free inside when judging whether a pod fits")
    comp.add_argument("--metrics-port", type=int, default=0, help="Prometheus port; 0: off")
    comp.add_argument("--leader-elect", action="store_true",
                      help="Lease-based leader election (run two replicas for HA)")
    comp.add_argument("--leader-namespace", default="vkprovider-system")
    comp.set_defaults(func=_descheduler)

    demo = sub.add_parser("demo", help="play the burst story on a local cluster, narrated")
    demo.add_argument("--keep", action="store_true", help="keep everything running at the end")
    demo.set_defaults(func=_demo)

    dev = sub.add_parser("dev", help="local development helpers")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser("up", help="start a local control plane with simulated GPU nodes")
    up.add_argument("--gpu-nodes", type=int, default=2)
    up.add_argument("--gpus", type=int, default=4, help="GPUs per simulated node")
    up.set_defaults(func=_dev_up)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(level=args.log_level, fmt=args.log_format)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:
        sys.stderr.write(f"vkprovider: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
