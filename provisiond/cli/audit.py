"""`provisiond audit`: who changed what, when, and which fields."""

from __future__ import annotations

import time

from provisiond.service.audit import read_audit


def register(subparsers) -> None:
    parser = subparsers.add_parser("audit", help="the audit log: every change, who, which "
                                   "fields")
    parser.add_argument("--after", type=int, default=0, metavar="SEQ",
                        help="entries after this sequence number")
    parser.add_argument("--limit", type=int, default=100, help="at most this many (1-1000)")
    parser.add_argument("--actor", help="only this actor (token:NAME, cli:USER)")
    parser.add_argument("--target", help="only this target (e.g. node:n001)")
    parser.add_argument("--action", help="only this action (e.g. node.patch)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=cmd_audit)


def cmd_audit(args, ctx) -> None:
    entries, _ = read_audit(ctx.config, after=args.after, limit=args.limit, actor=args.actor,
                            target=args.target, action=args.action)
    if args.json:
        return ctx.print_json(entries)
    ctx.print_table(["SEQ", "TIME", "ACTOR", "ACTION", "TARGET", "FIELDS"],
                    [[e["seq"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])),
                      e["actor"], e["action"], e["target"], _fields(e["changes"])]
                     for e in entries])
    return None


def _fields(changes) -> str:
    names = list(changes) if isinstance(changes, (list, dict)) else []
    return ",".join(map(str, names)) or "-"
