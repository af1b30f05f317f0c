"""Command-line entry points: ``vkprovider <command>``.

Why it exists: one package and one image serve every process (virtual kubelet, companion, mock
cloud, local development); the command picks which. Parsing stays here, the work lives in the
modules each command calls.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from vkprovider import logs


def _dev_up(args: argparse.Namespace) -> int:
    from vkprovider.devenv import run_dev_up

    return asyncio.run(run_dev_up(gpu_nodes=args.gpu_nodes, gpus_per_node=args.gpus))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vkprovider", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("json", "text"), default="text")
    sub = parser.add_subparsers(dest="command", required=True)

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


if __name__ == "__main__":
    sys.exit(main())
