"""Power and firmware: the BMC driver interface, the redfish/ipmi/fake drivers, fan-out
over node ranges, and `node reprovision`."""

from __future__ import annotations

import argparse

from provisiond.power.fanout import NodeResult
from provisiond.power.operations import select_nodes
from provisiond.power.progress import ProgressBar
from provisiond.power.report import print_results
from provisiond.power.reprovision import DEFAULT_TIMEOUT, reprovision


def add_reprovision_parser(node_subparsers) -> argparse.ArgumentParser:
    """Add `node reprovision RANGE` to the `node` noun's subparsers."""
    parser = node_subparsers.add_parser(
        "reprovision", help="PXE boot once, power cycle, wait until the nodes are ready",
        description="Set the next boot to PXE, power cycle, and wait until every node "
        "reports ready from the new boot. Exits non-zero if any node is not ready in time.")
    parser.add_argument("range", metavar="RANGE", help="nodes, e.g. n[001-008]")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"how long to wait for ready (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cli_reprovision)
    return parser


def cli_reprovision(args, ctx) -> int:
    """`node reprovision RANGE`: a progress bar on a terminal, then the per-node table."""
    total = len(select_nodes(ctx.config, args.range))
    progress = ProgressBar(total, "reprovision")
    results = reprovision(ctx.config, args.range, args.timeout, progress)
    return print_results(ctx, results, args.json)


__all__ = ["NodeResult", "reprovision", "cli_reprovision", "add_reprovision_parser"]
