"""`add`, `set`, `list`, `show`, `delete` for nodes and profiles: one implementation, two nouns."""

from __future__ import annotations

import argparse
import sys

import yaml

from provisiond.cli.record_options import (add_record_flags, apply_edits, find_field,
                                          record_edits)
from provisiond.errors import AlreadyExists, InUse, InvalidInput, NodeNotFound, ProfileNotFound
from provisiond.inventory import InventoryStore
from provisiond.lifecycle import check_forgettable, edit_inventory, forget_nodes
from provisiond.inventory.merge import merge_node, merge_nodes
from provisiond.inventory.model import Inventory, Record, check_name, node_sort_key
from provisiond.inventory.ranges import expand, fold
from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore


class Kind:
    """What differs between the node and profile nouns."""

    def __init__(self, noun: str):
        self.noun = noun
        self.key = f"{noun}s"
        self.not_found = NodeNotFound if noun == "node" else ProfileNotFound

    def records(self, inventory: Inventory) -> dict[str, Record]:
        return getattr(inventory, self.key)

    def names(self, pattern: str) -> list[str]:
        names = expand(pattern) if self.noun == "node" else [pattern]
        for name in names:
            try:
                check_name(name, f"{self.noun} name")
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
        return names

    def existing(self, inventory: Inventory, pattern: str) -> list[str]:
        names = self.names(pattern)
        missing = [n for n in names if n not in self.records(inventory)]
        if missing:
            raise self.not_found(f"no such {self.noun}: {fold(missing)}")
        return names


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
    listing.add_argument("names", nargs="?", metavar="NAMES", help=range_help)
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
    with edit_inventory(ctx.config) as inventory:
        records = kind.records(inventory)
        taken = [n for n in names if n in records]
        if taken:
            raise AlreadyExists(f"{kind.noun} {fold(taken)} already exists (use `set`)")
        if kind.noun == "node" and not args.profile and "default" in inventory.profiles:
            args.profile = ["default"]
        for name, edits in zip(names, record_edits(args, len(names))):
            records[name] = apply_edits(Record(), edits, [], f"{kind.noun} {name}")
    _store_password(ctx, kind, names, password)
    print(f"added {kind.noun} {fold(names)} (inventory revision {inventory.revision})")


def set_records(args, ctx, kind: Kind) -> None:
    password = ctx.read_secret("BMC password") if args.bmc_password_stdin else None
    with edit_inventory(ctx.config) as inventory:
        names = kind.existing(inventory, args.names)
        records = kind.records(inventory)
        for name, edits in zip(names, record_edits(args, len(names))):
            records[name] = apply_edits(records[name], edits, args.unset, f"{kind.noun} {name}")
    _store_password(ctx, kind, names, password)
    print(f"updated {kind.noun} {fold(names)} (inventory revision {inventory.revision})")


def _store_password(ctx, kind: Kind, names: list[str], password: str | None) -> None:
    """Store the password read before the inventory edit (so an empty one changes nothing)."""
    if password is not None:
        SecretStore(ctx.config).set(kind.key, names, BMC_PASSWORD, password)


def list_records(args, ctx, kind: Kind) -> None:
    inventory = InventoryStore(ctx.config).read()
    records = kind.records(inventory)
    names = kind.existing(inventory, args.names) if args.names else list(records)
    names.sort(key=node_sort_key)
    if kind.noun == "node":
        merged = list(merge_nodes(inventory, names).values())
        if args.json:
            return ctx.print_json([node.to_data() for node in merged])
        ctx.print_table(["NAME", "PROFILES", "IMAGE", "IPADDR", "MAC", "BMC"],
                        [_node_row(node) for node in merged])
        return None
    if args.json:
        return ctx.print_json([{"name": n, **records[n].to_data()} for n in names])
    users = _profile_users(inventory)
    ctx.print_table(["NAME", "NODES", "IMAGE", "OVERLAYS", "COMMENT"],
                    [[n, fold(users.get(n, [])) or "-", records[n].image,
                      ",".join(records[n].system_overlays or []), records[n].comment]
                     for n in names])
    return None


def _node_row(node) -> list:
    record = node.record
    primary = node.primary_netdev
    bmc = record.bmc
    bmc_text = f"{bmc.driver.value if bmc.driver else '?'}:{bmc.address}" if bmc and bmc.address else None
    return [node.name, ",".join(record.profiles or []), record.image,
            primary[1].ipaddr if primary else None, primary[1].mac if primary else None, bmc_text]


def _profile_users(inventory: Inventory) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {}
    for name, record in inventory.nodes.items():
        for profile in record.profiles or []:
            users.setdefault(profile, []).append(name)
    return users


def show_record(args, ctx, kind: Kind) -> None:
    inventory = InventoryStore(ctx.config).read()
    name = kind.existing(inventory, args.name)[0]
    if kind.noun == "node" and args.all:
        node = merge_node(inventory, name)
        if args.json:
            return ctx.print_json({"record": node.to_data(), "provenance": node.provenance})
        rows = [[path, _value_at(node.to_data(), path), source]
                for path, source in sorted(node.provenance.items())]
        ctx.print_table(["FIELD", "VALUE", "SOURCE"], rows)
        return None
    data = {"name": name, **kind.records(inventory)[name].to_data()}
    if args.json:
        return ctx.print_json(data)
    print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    return None


def _value_at(data: dict, path: str):
    found = find_field(data, path)
    value = found[0][found[1]] if found else None
    return ",".join(map(str, value)) if isinstance(value, list) else value


def delete_records(args, ctx, kind: Kind) -> None:
    inventory = InventoryStore(ctx.config).read()
    names = kind.existing(inventory, args.names)
    if kind.noun == "profile":
        users = _profile_users(inventory).get(names[0])
        if users:
            raise InUse(f"profile {names[0]} is used by node {fold(users)}")
    confirm(f"delete {kind.noun} {fold(names)} ({len(names)})", args.yes)
    check_forgettable(ctx.config)
    with edit_inventory(ctx.config, inventory.revision) as inventory:
        for name in names:
            del kind.records(inventory)[name]
    forget_records(ctx.config, kind.key, names)
    print(f"deleted {kind.noun} {fold(names)} (inventory revision {inventory.revision})")


def forget_records(config, key: str, names: list[str]) -> None:
    """After deleting records: a node's secrets, host keys, builds and status go too."""
    if key == "nodes":
        forget_nodes(config, names)
    else:
        SecretStore(config).forget(key, names)


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
