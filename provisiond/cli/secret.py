"""`provisiond secret set|unset|list|rotate`: values come from stdin or a file, never from
argv, and are never printed."""

from __future__ import annotations

from pathlib import Path

from provisiond.audit import cli_actor
from provisiond.errors import InvalidInput
from provisiond.inventory.ranges import fold
from provisiond.lifecycle import GENERATED_SECRETS
from provisiond.service import secrets
from provisiond.service.inventory import NODES, PROFILES, snapshot


def register(subparsers) -> None:
    parser = subparsers.add_parser("secret", help="store secrets (BMC passwords, tokens, keys)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    put = verbs.add_parser(
        "set", help="store a value (stdin, or --file) for nodes or a profile",
        description="Store a secret for nodes (a range) or a profile, 0600 apart from the "
        "inventory. Runtime overlay templates of those nodes read it as secrets[\"KEY\"] "
        "(a node's own value wins, then its profiles right to left); system overlays never "
        "see secrets. The value comes from --file (kept as it is) or stdin (one line at a "
        "terminal; else all of it without its last line end), never from the command line.")
    unset = verbs.add_parser(
        "unset", help="remove a secret",
        description="Remove a secret from nodes (a range) or a profile: from those that "
        "have it, saying which had none; if none has it, nothing is written and the exit "
        "status is 3 (not found).")
    for sub in (put, unset):
        sub.add_argument("kind", choices=["node", "profile"])
        sub.add_argument("names", help="node range or profile name")
        sub.add_argument("key", help="e.g. bmc_password, munge.key, nomad_token")
    put.add_argument("--file", metavar="PATH", help="read the value from this file (UTF-8, "
                     f"at most {secrets.MAX_VALUE >> 10} KiB)")
    put.set_defaults(func=lambda a, c: _set(a, c, _value(a, c)))
    unset.set_defaults(func=lambda a, c: _set(a, c, None))
    listing = verbs.add_parser("list", help="which records have which secrets (no values)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=_list)
    rotate = verbs.add_parser(
        "rotate", help="make generated secrets anew (ssh host keys)",
        description="Make the nodes' generated secret anew and rebuild their runtime "
        "overlays; running nodes install it at their agent's next refresh (every 5-6 "
        "minutes) and reload sshd, without a reboot.")
    rotate.add_argument("names", metavar="RANGE", help="node range")
    rotate.add_argument("what", choices=sorted(GENERATED_SECRETS))
    rotate.set_defaults(func=_rotate)


def _value(args, ctx) -> str:
    if not args.file:
        return ctx.read_secret(args.key)
    most = 4 * secrets.MAX_VALUE  # bytes of as many UTF-8 characters
    try:
        with open(args.file, "rb") as handle:
            data = handle.read(most + 1)
    except OSError as exc:
        raise InvalidInput(f"--file: cannot read {args.file}: {exc.strerror}") from None
    if len(data) > most:
        raise InvalidInput(f"--file: {args.file} is larger than a secret may be")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"--file: {Path(args.file).name} is not UTF-8 text (store binary "
                           "keys base64-encoded)") from None


def _set(args, ctx, value: str | None) -> None:
    kind = NODES if args.kind == "node" else PROFILES
    names = kind.existing(snapshot(ctx.config).inventory, args.names)
    changed = secrets.set_secret(ctx.config, cli_actor(), kind, names, args.key, value)
    if value is not None:
        print(f"stored {args.key} for {len(names)} {args.kind}(s)")
        return
    removed = set(changed)
    rest = [name for name in names if name not in removed]
    print(f"removed {args.key} from {len(changed)} of {len(names)} {args.kind}(s)"
          + (f"; {fold(rest)} had none" if rest else ""))


def _rotate(args, ctx) -> None:
    names = NODES.existing(snapshot(ctx.config).inventory, args.names)
    summary = secrets.rotate_secret(ctx.config, cli_actor(), names, args.what)
    print(f"rotated {args.what} of {len(names)} node(s); runtime overlays rebuilt: "
          f"{summary['rebuilt'].get('runtime', 0)} (running nodes take them at their next "
          "refresh)")


def _list(args, ctx) -> None:
    found = secrets.list_secrets(ctx.config)
    if args.json:
        return ctx.print_json(found)
    ctx.print_table(["KIND", "NAME", "KEYS"],
                    [[s["kind"], s["name"], ",".join(s["keys"])] for s in found])
    return None
