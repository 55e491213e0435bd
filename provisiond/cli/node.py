"""`provisiond node add|set|list|show|delete|status|reprovision`."""

from __future__ import annotations

import time

from provisiond.cli.records import register_verbs
from provisiond.power import add_reprovision_parser
from provisiond.states import NodePhase
from provisiond.service.inventory import NODES
from provisiond.service.status import list_status

PHASE_ORDER = [p.value for p in NodePhase if p is not NodePhase.FAILED]


def register(subparsers) -> None:
    verbs = register_verbs(subparsers, NODES)
    status = verbs.add_parser("status", help="each node's boot phase and when it was reached")
    status.add_argument("names", nargs="?", metavar="NAMES", help="node range")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=show_status)
    add_reprovision_parser(verbs)


def show_status(args, ctx) -> None:
    statuses, _ = list_status(ctx.config, args.names)
    if args.json:
        return ctx.print_json({s["node"]: s if s["phase"] else None for s in statuses})
    ctx.print_table(["NODE", "PHASE", "UPDATED", "BOOT TIMELINE (s since dhcp)", "DETAIL"],
                    [_status_row(s["node"], s) for s in statuses])
    return None


def _status_row(name: str, status: dict) -> list:
    if not status["phase"]:
        return [name, "unknown", None, None, None]
    start = status.get("boot_started", 0)
    phases = status.get("phases", {})
    timeline = " ".join(f"{p}+{phases[p] - start:.1f}" for p in PHASE_ORDER if p in phases)
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.get("updated", 0)))
    return [name, status.get("phase"), updated, timeline, status.get("detail") or None]
