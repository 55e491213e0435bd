"""`add`, `set`, `list`, `show`, `delete` for nodes and profiles: one implementation, two nouns,
over the service layer the API uses too (provisiond.service.records)."""

from __future__ import annotations

import argparse
import sys
import time

import yaml

from provisiond.audit import cli_actor
from provisiond.cli.record_options import (add_record_flags, apply_edits, find_field,
                                          record_edits)
from provisiond.discovery.facts import facts_of
from provisiond.errors import InvalidInput
from provisiond.inventory.ranges import fold
from provisiond.service import records, secrets
from provisiond.service.inventory import Kind, snapshot


def register_verbs(subparsers, kind: Kind) -> argparse._SubParsersAction:
    """Add the noun parser with its five verbs; returns its subparsers for extra verbs."""
    range_help = "node range, e.g. n[001-128]" if kind.noun == "node" else "profile name"
    parser = subparsers.add_parser(kind.noun, help=f"manage {kind.key}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser("add", help=f"create {kind.key}")
    add.add_argument("names", metavar="NAMES", help=range_help)
    add_record_flags(add, kind.noun == "node", editing=False)
    add.set_defaults(func=lambda a, c: add_records(a, c, kind))
    edit = verbs.add_parser("set", help=f"change fields of existing {kind.key}")
    edit.add_argument("names", metavar="NAMES", help=range_help)
    add_record_flags(edit, kind.noun == "node", editing=True)
    edit.set_defaults(func=lambda a, c: set_records(a, c, kind))
    listing = verbs.add_parser("list", help=f"list {kind.key} (a table; --json for scripts)")
    listing.add_argument("names", nargs="?", metavar="NAMES",
                         help=f"{range_help}: those of them that exist" if kind.noun == "node"
                         else range_help)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=lambda a, c: list_records(a, c, kind))
    show = verbs.add_parser("show", help=f"show one {kind.noun}'s record")
    show.add_argument("name")
    show.add_argument("--all", action="store_true",
                      help="the merged record and which profile set each field")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=lambda a, c: show_record(a, c, kind))
    delete = verbs.add_parser("delete", help=f"delete {kind.key}")
    delete.add_argument("names", metavar="NAMES", help=range_help)
    delete.add_argument("--yes", action="store_true",
                        help="delete without asking (needed when stdin is not a terminal)")
    delete.set_defaults(func=lambda a, c: delete_records(a, c, kind))
    return verbs


def add_records(args, ctx, kind: Kind) -> None:
    names = kind.names(args.names)
    password = ctx.read_secret("BMC password") if args.bmc_password_stdin else None
    data = record_edits(args, 1)[0]  # the service counts a range's addresses up
    written = records.create_records(ctx.config, cli_actor(), kind, names, data)
    _store_password(ctx, kind, names, password)
    print(f"added {kind.noun} {fold(names)} (inventory revision {written.revision})")


def set_records(args, ctx, kind: Kind) -> None:
    password = ctx.read_secret("BMC password") if args.bmc_password_stdin else None
    names = kind.existing(snapshot(ctx.config).inventory, args.names)
    edits = dict(zip(names, record_edits(args, len(names))))
    written = records.write_records(
        ctx.config, cli_actor(), kind, "set", names,
        lambda name, stored: apply_edits(stored, edits[name], args.unset, f"{kind.noun} {name}"))
    _store_password(ctx, kind, names, password)
    print(f"updated {kind.noun} {fold(names)} (inventory revision {written.revision})")


def _store_password(ctx, kind: Kind, names: list[str], password: str | None) -> None:
    """Store the password read before the inventory edit (so an empty one changes nothing)."""
    if password is not None:
        secrets.set_secret(ctx.config, cli_actor(), kind, names, secrets.BMC_PASSWORD,
                           password)


def list_records(args, ctx, kind: Kind) -> None:
    view = snapshot(ctx.config)
    inventory = view.inventory
    stored = kind.records(inventory)
    names = kind.present(inventory, args.names) if args.names else view.sorted_names(kind)[0]
    if kind.noun == "node":
        merged = [view.merged(name) for name in names]
        if args.json:
            return ctx.print_json([node.to_data() for node in merged])
        ctx.print_table(["NAME", "PROFILES", "IMAGE", "IPADDR", "MAC", "BMC"],
                        [_node_row(node) for node in merged])
        return None
    if args.json:
        return ctx.print_json([{"name": n, **stored[n].to_data()} for n in names])
    users = records.profile_users(inventory)
    ctx.print_table(["NAME", "NODES", "IMAGE", "OVERLAYS", "COMMENT"],
                    [[n, fold(users.get(n, [])) or "-", stored[n].image,
                      ",".join(stored[n].system_overlays or []), stored[n].comment]
                     for n in names])
    return None


def _node_row(node) -> list:
    record = node.record
    primary = node.primary_netdev
    bmc = record.bmc
    bmc_text = f"{bmc.driver.value if bmc.driver else '?'}:{bmc.address}" if bmc and bmc.address else None
    return [node.name, ",".join(record.profiles or []), record.image,
            primary[1].ipaddr if primary else None, primary[1].mac if primary else None, bmc_text]


def show_record(args, ctx, kind: Kind) -> None:
    name = kind.names(args.name)[0]
    found = records.get_record(ctx.config, kind, name, merged=kind.noun == "node" and args.all)
    if found.provenance is not None:
        if args.json:
            return ctx.print_json({"record": {"name": name, **found.record},
                                   "provenance": found.provenance})
        rows = [[path, _value_at(found.record, path), source]
                for path, source in sorted(found.provenance.items())]
        ctx.print_table(["FIELD", "VALUE", "SOURCE"], rows)
        return None
    data = {"name": name, **found.record}
    if args.json:
        return ctx.print_json(data)
    print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    if kind.noun == "node":
        print(facts_text(facts_of(ctx.config, name)))
    return None


def facts_text(stored) -> str:
    """A node's reported facts for `node show`, with when they came."""
    if stored is None:
        return "# facts: none reported yet (the agent reports them at each boot)"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stored.time))
    facts = stored.facts.model_dump(mode="json", exclude_none=True)
    body = yaml.safe_dump({"facts": facts}, sort_keys=False, default_flow_style=False)
    return f"# facts reported {when}\n" + body.rstrip()


def _value_at(data: dict, path: str):
    found = find_field(data, path)
    value = found[0][found[1]] if found else None
    return ",".join(map(str, value)) if isinstance(value, list) else value


def delete_records(args, ctx, kind: Kind) -> None:
    view = snapshot(ctx.config)
    names = kind.existing(view.inventory, args.names)
    records.check_deletable(view.inventory, kind, names)
    confirm(f"delete {kind.noun} {fold(names)} ({len(names)})", args.yes)
    written = records.delete_records(ctx.config, cli_actor(), kind, names,
                                     expected_revision=view.revision)
    print(f"deleted {kind.noun} {fold(names)} (inventory revision {written.revision})")


def confirm(action: str, yes: bool) -> None:
    """Go on with `action` given --yes or a 'yes' typed at a terminal; else InvalidInput."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise InvalidInput(f"refusing to {action} without --yes (stdin is not a terminal)")
    try:
        answer = input(f"{action}? [y/N] ").strip().lower()
    except EOFError:  # Ctrl-D: a no
        print(file=sys.stderr)
        answer = ""
    if answer not in ("y", "yes"):
        raise InvalidInput(f"did not {action}: not confirmed")
