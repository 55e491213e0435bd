"""`provisiond node add|set|list|show|delete|status|reprovision|revoke`."""

from __future__ import annotations

import time

from provisiond.audit import cli_actor
from provisiond.cli.power import add_reprovision_parser
from provisiond.cli.records import register_verbs
from provisiond.inventory import InventoryStore
from provisiond.states import NodePhase
from provisiond.service import credentials
from provisiond.service.inventory import NODES
from provisiond.service.status import list_status
from provisiond.status import REFUSAL

PHASE_ORDER = [p.value for p in NodePhase if p is not NodePhase.FAILED]


def register(subparsers) -> None:
    verbs = register_verbs(subparsers, NODES)
    status = verbs.add_parser("status", help="each node's boot phase and when it was reached")
    status.add_argument("names", nargs="?", metavar="NAMES",
                        help="node range: those of its nodes that exist")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=show_status)
    add_reprovision_parser(verbs)
    ending = verbs.add_parser(
        "revoke", help="end the nodes' credentials (and every token minted until now)",
        description="End the node credentials of RANGE: their agents can no longer fetch "
        "the runtime overlay or report; a node gets a new credential only by booting again.")
    ending.add_argument("names", metavar="RANGE", help="node range")
    ending.set_defaults(func=revoke_credentials)


def revoke_credentials(args, ctx) -> None:
    names = NODES.existing(InventoryStore(ctx.config).read(), args.names)
    ended = credentials.revoke_credentials(ctx.config, cli_actor(), names)
    print(f"revoked: {len(ended)} of {len(names)} node(s) had a credential")


def show_status(args, ctx) -> None:
    statuses, _ = list_status(ctx.config, args.names)
    if args.json:
        return ctx.print_json({s["node"]: s if s["phase"] or s.get(REFUSAL) else None
                               for s in statuses})
    rows = [_status_row(s["node"], s) for s in statuses]
    columns = ["NODE", "PHASE", "UPDATED", "BOOT TIMELINE (s since dhcp)", "DETAIL",
               "LAST TOKEN REFUSED"]
    if not any(row[-1] for row in rows):  # the column only when a node has one
        columns, rows = columns[:-1], [row[:-1] for row in rows]
    ctx.print_table(columns, rows)
    for status in statuses:  # why it failed, in full: the table cuts details to fit
        if status["phase"] == NodePhase.FAILED.value and status.get("detail"):
            ctx.print_line(f"{status['node']} failed: {status['detail']}")
    return None


def _status_row(name: str, status: dict) -> list:
    refused = _refusal(status.get(REFUSAL))
    if not status["phase"]:
        return [name, "unknown", None, None, None, refused]
    start = status.get("boot_started", 0)
    phases = status.get("phases", {})
    timeline = " ".join(f"{p}+{phases[p] - start:.1f}" for p in PHASE_ORDER if p in phases)
    updated = _clock(status.get("updated", 0))
    return [name, status.get("phase"), updated, timeline, status.get("detail") or None,
            refused]


def _refusal(refused: dict | None) -> str | None:
    """`TIME REASON from ADDRESS` of the node's last refused provisioning token."""
    if not isinstance(refused, dict):
        return None
    return f"{_clock(refused.get('time', 0))} {refused.get('reason')} from " \
           f"{refused.get('address')}"


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
