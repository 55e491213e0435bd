"""`provisiond apply -f FILE`: make the inventory match a declarative file."""

from __future__ import annotations

import sys

from provisiond.documents import load_yaml_mapping
from provisiond.errors import InvalidInventory
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Inventory, Record
from provisiond.inventory.ranges import expand
from provisiond.inventory.store import validate_inventory_data


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "apply", help="make nodes and profiles match a YAML file (prints the plan first)",
        description="Each node and profile in FILE replaces the stored one of that name. "
        "Node keys may be ranges (n[01-04]). Without --prune, records missing from FILE "
        "are kept.")
    parser.add_argument("-f", "--file", required=True, help="YAML file, - for stdin")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--prune", action="store_true",
                        help="delete nodes and profiles that FILE does not name")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=run)


def run(args, ctx) -> None:
    desired = read_desired(args.file)
    with InventoryStore(ctx.config).edit() as inventory:
        plan = make_plan(inventory, desired, args.prune)
        if not args.dry_run:
            carry_out(inventory, desired, plan)
        _print_plan(ctx, args, plan, inventory.revision)
        if args.dry_run:
            return
    if not args.json:
        print(f"applied: inventory revision {inventory.revision}" if _changes(plan)
              else "nothing to change")


def read_desired(path: str) -> Inventory:
    text = sys.stdin.read() if path == "-" else _read(path)
    data = _load_yaml(text, path)
    nodes = {}
    for key, record in (data.get("nodes") or {}).items():
        for name in expand(str(key)):
            nodes[name] = record
    data["nodes"] = nodes
    data.setdefault("revision", 0)
    return validate_inventory_data(data, path)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _load_yaml(text: str, origin: str) -> dict:
    expected = "a mapping with only 'nodes' and 'profiles'"
    data = load_yaml_mapping(text, origin, InvalidInventory, expected)
    if not set(data) <= {"nodes", "profiles"}:
        raise InvalidInventory(f"{origin}: expected {expected}")
    return data


def make_plan(current: Inventory, desired: Inventory, prune: bool) -> dict[str, list]:
    """create/update/delete lists of ('node'|'profile', name)."""
    plan: dict[str, list] = {"create": [], "update": [], "delete": []}
    for kind in ("profiles", "nodes"):
        have: dict[str, Record] = getattr(current, kind)
        want: dict[str, Record] = getattr(desired, kind)
        for name, record in want.items():
            if name not in have:
                plan["create"].append((kind[:-1], name))
            elif have[name].to_data() != record.to_data():
                plan["update"].append((kind[:-1], name))
        if prune:
            plan["delete"].extend((kind[:-1], n) for n in have if n not in want)
    return plan


def carry_out(inventory: Inventory, desired: Inventory, plan: dict[str, list]) -> None:
    for kind, name in plan["create"] + plan["update"]:
        getattr(inventory, f"{kind}s")[name] = getattr(desired, f"{kind}s")[name]
    for kind, name in plan["delete"]:
        del getattr(inventory, f"{kind}s")[name]


def _changes(plan: dict[str, list]) -> int:
    return sum(len(v) for v in plan.values())


def _print_plan(ctx, args, plan: dict[str, list], revision: int) -> None:
    if args.json:
        ctx.print_json({action: [{"kind": k, "name": n} for k, n in items]
                        for action, items in plan.items()})
        return
    for action, sign in (("create", "+"), ("update", "~"), ("delete", "-")):
        for kind, name in plan[action]:
            print(f"{sign} {action} {kind} {name}")
    counts = ", ".join(f"{len(plan[a])} to {a}" for a in ("create", "update", "delete"))
    print(f"plan: {counts}{' (dry run: nothing changed)' if args.dry_run else ''}")
