"""`provisiond secret set|unset|list`: values come from stdin and are never printed."""

from __future__ import annotations

from provisiond.audit import cli_actor
from provisiond.service import secrets
from provisiond.service.inventory import NODES, PROFILES, snapshot


def register(subparsers) -> None:
    parser = subparsers.add_parser("secret", help="store secrets (BMC passwords, tokens)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    put = verbs.add_parser("set", help="read a value from stdin into the secrets file")
    unset = verbs.add_parser("unset", help="remove a secret")
    for sub in (put, unset):
        sub.add_argument("kind", choices=["node", "profile"])
        sub.add_argument("names", help="node range or profile name")
        sub.add_argument("key", help="e.g. bmc_password")
    put.set_defaults(func=lambda a, c: _set(a, c, c.read_secret(a.key)))
    unset.set_defaults(func=lambda a, c: _set(a, c, None))
    listing = verbs.add_parser("list", help="which records have which secrets (no values)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=_list)


def _set(args, ctx, value: str | None) -> None:
    kind = NODES if args.kind == "node" else PROFILES
    names = kind.existing(snapshot(ctx.config).inventory, args.names)
    secrets.set_secret(ctx.config, cli_actor(), kind, names, args.key, value)
    print(f"{'stored' if value is not None else 'removed'} {args.key} for {len(names)} "
          f"{args.kind}(s)")


def _list(args, ctx) -> None:
    found = secrets.list_secrets(ctx.config)
    if args.json:
        return ctx.print_json(found)
    ctx.print_table(["KIND", "NAME", "KEYS"],
                    [[s["kind"], s["name"], ",".join(s["keys"])] for s in found])
    return None
