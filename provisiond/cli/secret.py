"""`provisiond secret set|unset|list`: values come from stdin and are never printed."""

from __future__ import annotations

from provisiond.cli.records import Kind
from provisiond.inventory import InventoryStore
from provisiond.inventory.secrets import SecretStore


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
    kind = Kind(args.kind)
    names = kind.existing(InventoryStore(ctx.config).read(), args.names)
    SecretStore(ctx.config).set(kind.key, names, args.key, value)
    print(f"{'stored' if value is not None else 'removed'} {args.key} for {len(names)} "
          f"{args.kind}(s)")


def _list(args, ctx) -> None:
    data = SecretStore(ctx.config).read()
    rows = [[kind[:-1], name, ",".join(sorted(keys))]
            for kind in ("profiles", "nodes") for name, keys in sorted((data.get(kind) or {}).items())]
    if args.json:
        return ctx.print_json([{"kind": k, "name": n, "keys": v.split(",")} for k, n, v in rows])
    ctx.print_table(["KIND", "NAME", "KEYS"], rows)
    return None
