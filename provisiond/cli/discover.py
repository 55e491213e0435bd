"""`provisiond discover list|show|approve|reject|rules`: machines that booted the discovery
image, and making nodes of them."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from provisiond.audit import cli_actor
from provisiond.discovery.facts import FACT_NAMES, flat_facts
from provisiond.discovery.machines import MachineState
from provisiond.service import discovery


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "discover", help="discovered machines: list, show, approve as nodes, reject",
        description="With dhcp.discovery on and a discovery.pool, unknown machines boot the "
        "discovery image, report their hardware and wait. Approve them as nodes (names and "
        "addresses from a sequence) or reject them; rules in <state>/discovery/rules.yaml "
        "approve matching machines as they report.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="machines in discovery order")
    listing.add_argument("--state", choices=[s.value for s in MachineState])
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="one machine's record and facts")
    show.add_argument("mac")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    approve = verbs.add_parser(
        "approve", help="make nodes of machines, names and addresses from a sequence",
        description="Without MACs: every pending machine, in discovery order (or --sort). "
        "Each gets the next name of --names that no node has, and the address as far from "
        "--ipaddr as its name is from the first name; one machine: name it alone.")
    approve.add_argument("macs", nargs="*", metavar="MAC", help="these machines, in this order")
    approve.add_argument("--names", required=True, metavar="RANGE", help="e.g. n[065-128]")
    approve.add_argument("--ipaddr", help="the first name's address, e.g. 10.10.0.75")
    approve.add_argument("--profile", help="the nodes' profile (default: default)")
    approve.add_argument("--sort", metavar="FACT", choices=FACT_NAMES,
                         help="order by a fact (dmi.serial, bmc.address, mac...)")
    approve.add_argument("--netdev", default="eth0", help="the netdev holding MAC and address")
    approve.add_argument("--gateway", help="the netdev's gateway")
    approve.add_argument("--json", action="store_true")
    approve.set_defaults(func=cmd_approve)
    reject = verbs.add_parser("reject", help="reject machines: they power off")
    reject.add_argument("macs", nargs="+", metavar="MAC")
    reject.set_defaults(func=cmd_reject)
    rules = verbs.add_parser("rules", help="show the rules (checked), or check a file")
    rules.add_argument("--file", type=Path, help="check this file instead of the state dir's")
    rules.add_argument("--json", action="store_true")
    rules.set_defaults(func=cmd_rules)


def cmd_list(args, ctx) -> None:
    found, cursor = discovery.list_machines(ctx.config, args.state, limit=1000)
    while cursor:
        more, cursor = discovery.list_machines(ctx.config, args.state, limit=1000, after=cursor)
        found += more
    if args.json:
        return ctx.print_json([m.model_dump(mode="json") for m in found])
    ctx.print_table(["#", "MAC", "STATE", "NODE", "PRODUCT", "SERIAL", "CPUS", "MEMORY",
                     "ADDRESS", "LAST SEEN"],
                    [[m.seq, m.mac, m.state.value, m.node, m.facts.dmi.product,
                      m.facts.dmi.serial, m.facts.cpu.threads, f"{m.facts.memory_mib} MiB",
                      m.address, _when(m.last_seen)] for m in found])
    return None


def cmd_show(args, ctx) -> None:
    machine = discovery.get_machine(ctx.config, args.mac)
    data = machine.model_dump(mode="json")
    if args.json:
        return ctx.print_json(data)
    print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    return None


def cmd_approve(args, ctx) -> None:
    approved = discovery.approve(ctx.config, cli_actor(), args.macs or None, args.names,
                                 args.ipaddr, args.profile, sort=args.sort,
                                 netdev=args.netdev, gateway=args.gateway)
    if args.json:
        return ctx.print_json([m.model_dump(mode="json") for m in approved])
    for machine in approved:
        sort = f" ({args.sort} {flat_facts(machine.facts, machine.mac)[args.sort]})" \
            if args.sort else ""
        ctx.print_line(f"approved {machine.mac} as {machine.node}{sort}")
    return None


def cmd_reject(args, ctx) -> None:
    for machine in discovery.reject(ctx.config, cli_actor(), args.macs):
        ctx.print_line(f"rejected {machine.mac}: it powers off at its next poll")


def cmd_rules(args, ctx) -> None:
    rules = discovery.check_rules(ctx.config, args.file)
    if args.json:
        return ctx.print_json([r.model_dump() for r in rules])
    ctx.print_table(["RULE", "MATCH", "PROFILE", "NAMES", "IPADDR"],
                    [[r.name, " ".join(f"{k}={v}" for k, v in r.match.items()), r.profile,
                      r.names, r.ipaddr] for r in rules])
    return None


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
