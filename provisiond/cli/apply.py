"""`provisiond apply -f FILE`: make the inventory match a declarative file."""

from __future__ import annotations

import json
import sys

from provisiond.audit import cli_actor
from provisiond.cli.records import confirm
from provisiond.documents import load_yaml_mapping
from provisiond.errors import InvalidInput, InvalidInventory
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Inventory
from provisiond.inventory.ranges import expand, spread_addresses
from provisiond.inventory.store import validate_inventory_data, yaml_read_as
from provisiond.lifecycle import check_forgettable
from provisiond.service.records import apply_inventory, field_changes

ACTIONS = (("create", "+"), ("update", "~"), ("delete", "-"))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "apply", help="make nodes and profiles match a YAML file (prints the plan first)",
        description="Each node and profile in FILE replaces the stored one of that name; the "
        "plan shows every field that changes. Node keys may be ranges (n[01-04]): their "
        "MACs, IPv4, IPv6 and BMC addresses count up from the value given, as with `node "
        "add`. Without --prune, records missing from FILE are kept. --dry-run checks "
        "everything a real run checks.")
    parser.add_argument("-f", "--file", required=True, help="YAML file, - for stdin")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and check it, change nothing")
    parser.add_argument("--prune", action="store_true",
                        help="delete nodes and profiles that FILE does not name (asks, or "
                        "needs --yes)")
    parser.add_argument("--yes", action="store_true", help="delete without asking (--prune)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def run(args, ctx) -> None:
    desired = read_desired(args.file)
    current = InventoryStore(ctx.config).read()
    plan = make_plan(current, desired, args.prune)
    _print_plan(ctx, args, plan)
    if plan["delete"]:
        check_forgettable(ctx.config)
        if not args.dry_run:
            confirm(f"delete {len(plan['delete'])} record(s)", args.yes)
    inventory = apply_inventory(ctx.config, cli_actor(), desired, plan,
                                expected_revision=current.revision, dry_run=args.dry_run)
    if args.dry_run:
        _say(args, "dry run: the plan is valid, nothing changed")
        return
    _say(args, f"applied: inventory revision {inventory.revision}" if _changes(plan)
         else "nothing to change")


def _say(args, line: str) -> None:
    if not args.json:
        print(line)


def read_desired(path: str) -> Inventory:
    raw = sys.stdin.buffer.read() if path == "-" else _read(path)
    data = _load_yaml(raw, path)
    data["nodes"] = _expand_nodes(data.get("nodes") or {}, path)
    data.setdefault("revision", 0)
    return validate_inventory_data(data, path)


def _expand_nodes(nodes: dict, origin: str) -> dict:
    """Range keys to one record per node, addresses counting up; a node named by two keys
    is an error (YAML itself refuses the same key twice)."""
    if not isinstance(nodes, dict):
        raise InvalidInventory(f"{origin}: nodes: expected a mapping of node names")
    expanded: dict = {}
    named_by: dict[str, str] = {}
    for key, record in nodes.items():
        names = expand(_node_key(key, origin))
        for name in names:
            other = named_by.setdefault(name, key)
            if other != key:
                raise InvalidInventory(f"{origin}: nodes: {name} is named by both "
                                       f"{other!r} and {key!r}")
        records = spread_addresses(record, len(names)) if isinstance(record, dict) else (
            [record] * len(names))
        expanded.update(zip(names, records))
    return expanded


def _node_key(key, origin: str) -> str:
    """A node key as written: YAML reads an unquoted 010 as 8 and 1_000 as 1000, which
    would name another node than the one written."""
    kind = yaml_read_as(key)
    if kind is not None:
        raise InvalidInventory(f"{origin}: nodes: key {key!r} is not a string (YAML read it "
                               f"as {kind}: put it in quotes)")
    if not isinstance(key, str):
        raise InvalidInventory(f"{origin}: nodes: key {key!r} is not a node name or range")
    return key


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise InvalidInput(f"{path}: {exc.strerror}") from None


def _load_yaml(raw: bytes, origin: str) -> dict:
    expected = "a mapping with only 'nodes' and 'profiles'"
    data = load_yaml_mapping(raw, origin, InvalidInventory, expected)
    if not set(data) <= {"nodes", "profiles"}:
        raise InvalidInventory(f"{origin}: expected {expected}")
    return data


def make_plan(current: Inventory, desired: Inventory, prune: bool) -> dict[str, list]:
    """create/update/delete lists of {kind, name, changes}: changes are every field whose
    value differs, as {field, before, after} (None: not set)."""
    plan: dict[str, list] = {"create": [], "update": [], "delete": []}
    for key in ("profiles", "nodes"):
        have, want = getattr(current, key), getattr(desired, key)
        for name, record in want.items():
            before = have[name].to_data() if name in have else {}
            changes = field_changes(before, record.to_data())
            if name not in have or changes:
                action = "update" if name in have else "create"
                plan[action].append({"kind": key[:-1], "name": name, "changes": changes})
        if prune:
            plan["delete"].extend(
                {"kind": key[:-1], "name": n, "changes": field_changes(have[n].to_data(), {})}
                for n in have if n not in want)
    return plan


def _changes(plan: dict[str, list]) -> int:
    return sum(len(v) for v in plan.values())


def _print_plan(ctx, args, plan: dict[str, list]) -> None:
    if args.json:
        ctx.print_json(plan)
        return
    for action, sign in ACTIONS:
        for change in plan[action]:
            print(f"{sign} {action} {change['kind']} {change['name']}")
            if action != "delete":
                for item in change["changes"]:
                    print(f"    {item['field']}: {_shown(item['before'])} -> "
                          f"{_shown(item['after'])}")
    counts = ", ".join(f"{len(plan[a])} to {a}" for a, _ in ACTIONS)
    print(f"plan: {counts}{' (dry run)' if args.dry_run else ''}")


def _shown(value) -> str:
    """A value as the plan prints it; (unset) for a field that is not set."""
    if value is None:
        return "(unset)"
    return value if isinstance(value, str) else json.dumps(value)
