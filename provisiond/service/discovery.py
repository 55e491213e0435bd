"""Discovery for the CLI and the API: the machines' reports, what each should do next, the
list, approval (names and addresses from a sequence, by hand or by rule) and rejection; and
the DHCP sightings of unknown MACs.

Approval writes the new nodes through `write_records` (validated, audited, an
`inventory.changed` event) and then marks the machines approved; a machine whose MAC is a
node's is told to reboot whatever its record says, so a crash between the two steps only
leaves a stale `pending`.
"""

from __future__ import annotations

import ipaddress
import logging

from provisiond.boot.discovery import read_discovery
from provisiond.config import Config
from provisiond.discovery import machines as book
from provisiond.discovery.facts import (FACT_NAMES, Facts, NodeFacts, facts_of, flat_facts,
                                        record_facts)
from provisiond.discovery.machines import Machine, MachineState
from provisiond.discovery.rules import Rule, first_match, load_rules, rules_path
from provisiond.errors import (AlreadyExists, InvalidInput, NodeNotFound, NotFound,
                               ProvisiondError)
from provisiond.inventory.ranges import consecutive, fold
from provisiond.inventory.values import normalise_mac
from provisiond.service.inventory import (NODES, check_limit, decode_cursor, encode_cursor,
                                          expand_names, snapshot)
from provisiond.service.journal import audit, emit
from provisiond.service.records import parse_record, write_records

log = logging.getLogger("provisiond.discovery")


def check_mac(mac: str, field: str = "mac") -> str:
    try:
        return normalise_mac(mac)
    except ValueError as exc:
        raise InvalidInput(str(exc), field=field) from None


def report(config: Config, mac: str, address: str, facts: Facts, node: str | None = None
           ) -> Machine | None:
    """A discovery image's report (`node`: the node the boot table has for the MAC): the
    machine enlisted (or its facts updated; approved as a node since deleted: anew) and,
    if it waits and a rule matches, approved by that rule. A node's MAC enlists nothing
    (None): the machine is told to reboot as the node, and a host on the boot network
    claiming that MAC adds no waiting machine that no approval could make a node."""
    if node is not None:
        return None
    machine, new = book.enlist(config, mac, address, facts, reopen=True,
                               nodes=node_macs(config))
    if new:
        emit(config, "discovery.enlisted", mac, {"seq": machine.seq, "address": address})
    if machine.state is MachineState.PENDING:
        machine = apply_rules(config, machine) or machine
    return machine


def apply_rules(config: Config, machine: Machine) -> Machine | None:
    """Approve a pending machine by the first rule that matches it; a rule that matches but
    cannot approve (names used up, an address taken) is noted on the machine and logged.
    A rules file that does not load approves nothing (logged)."""
    try:
        rules = load_rules(config)
    except ProvisiondError as exc:
        log.error("discovery rules not used: %s", exc)
        return None
    rule = first_match(rules, flat_facts(machine.facts, machine.mac))
    if rule is None:
        return None
    try:
        return _approve_by(config, rule, machine)
    except ProvisiondError as exc:
        problem = f"rule {rule.name}: {exc}"[:500]
        log.warning("discovery: %s not approved: %s", machine.mac, problem)
        book.note_problem(config, machine.mac, problem)
        return None


def _approve_by(config: Config, rule: Rule, machine: Machine) -> Machine:
    """Approve by `rule`; a name another writer (another worker's rule) took meanwhile: the
    next free one. Each such loss is one name of the sequence fewer, so this ends: at
    worst with the sequence used up (InvalidInput)."""
    for _ in range(len(expand_names(rule.names))):
        try:
            return approve(config, f"rule:{rule.name}", [machine.mac], rule.names,
                           rule.ipaddr, rule.profile, netdev=rule.netdev, gateway=rule.gateway)[0]
        except AlreadyExists:
            continue
    raise InvalidInput(f"{rule.names}: every name was taken while approving")


def next_action(config: Config, mac: str, node: str | None) -> dict:
    """What the machine with `mac` should do (`node`: the node the boot table has for it):
    reboot as that node, power off (rejected), report its facts (unknown here), or wait."""
    if node is not None:
        return {"action": "reboot", "node": node}
    machine = book.read_book(config).machines.get(mac)
    if machine is None:
        return {"action": "report", "node": None}
    if machine.state is MachineState.REJECTED:
        return {"action": "poweroff", "node": None}
    if machine.state is MachineState.APPROVED:  # as a node deleted since: enlist anew
        return {"action": "report", "node": None}
    return {"action": "wait", "node": None}


def list_machines(config: Config, state: str | None = None, mac: str | None = None, *,
                  limit: int = 100, after: str | None = None
                  ) -> tuple[list[Machine], str | None]:
    """A page of machines in discovery order and the next page's cursor (a sequence number)."""
    mac = check_mac(mac) if mac is not None else None
    start = decode_cursor(after, int) or 0
    check_limit(limit)
    found = sorted((m for m in book.read_book(config).machines.values()
                    if m.seq > start and (state is None or m.state.value == state)
                    and (mac is None or m.mac == mac)), key=lambda m: m.seq)
    page = found[:limit]
    return page, encode_cursor(page[-1].seq) if len(found) > limit else None


def get_machine(config: Config, mac: str) -> Machine:
    return book.get_machine(config, check_mac(mac))


def chosen_machines(config: Config, macs: list[str] | None, sort: str | None) -> list[Machine]:
    """The named machines (any state but approved) in the order given, or every pending one
    in discovery order; sorted by the fact `sort` (stable; machines without it last)."""
    machines = book.read_book(config).machines
    if macs:
        chosen = [machines.get(m) or _missing(m) for m in (check_mac(m, "macs") for m in macs)]
        done = [m.mac for m in chosen if m.state is MachineState.APPROVED]
        if done:
            raise InvalidInput(f"already approved: {', '.join(done)}", field="macs")
    else:
        nodes = node_macs(config)  # a MAC put in a node by hand (or a crash) since it enlisted
        chosen = sorted((m for m in machines.values()
                         if m.state is MachineState.PENDING and m.mac not in nodes),
                        key=lambda m: m.seq)
    if sort is not None:
        if sort not in FACT_NAMES:
            raise InvalidInput(f"cannot sort by {sort!r}; facts: {', '.join(FACT_NAMES)}",
                               field="sort")
        chosen.sort(key=lambda m: _sort_key(flat_facts(m.facts, m.mac).get(sort)))
    if not chosen:
        raise InvalidInput("no machine waits for approval", field="macs")
    return chosen


def node_macs(config: Config) -> dict[str, str]:
    """The MACs the inventory's nodes have, and whose each is."""
    return {device.mac: name for name, record in snapshot(config).inventory.nodes.items()
            for device in (record.netdevs or {}).values() if device.mac}


def _missing(mac: str):
    raise book.MachineNotFound(f"no discovered machine with MAC {mac}", field="macs")


def _sort_key(value) -> tuple:
    if value is None:
        return (2, 0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))


def assignments(config: Config, count: int, names: str, ipaddr: str | None
                ) -> list[tuple[str, str | None]]:
    """(name, address) for `count` machines: the names of the sequence no node has yet, in
    order, each with the address as far from `ipaddr` as its name is from the first."""
    sequence = expand_names(names)
    addresses = consecutive(ipaddr, len(sequence), "ipaddr") if ipaddr else [None] * len(
        sequence)
    taken = set(snapshot(config).inventory.nodes)
    free = [(n, a) for n, a in zip(sequence, addresses) if n not in taken]
    if len(free) < count:
        raise InvalidInput(f"{names} has {len(free)} free names for {count} machines",
                           field="names")
    check_outside_pool(config, [a for _, a in free[:count] if a])
    return free[:count]


def check_outside_pool(config: Config, addresses: list[str]) -> None:
    """No node gets an address the discovery pool leases (to another machine, maybe now)."""
    pool = config.discovery.pool_range
    inside = [a for a in addresses if pool and pool[0] <= _ipv4(a) <= pool[1]]
    if inside:
        raise InvalidInput(f"ipaddr: {inside[0]} is in discovery.pool "
                           f"({config.discovery.pool}), which leases unknown machines",
                           field="ipaddr")


def _ipv4(text: str) -> ipaddress.IPv4Address:
    """The address, or 0.0.0.0 for what is none (the node's schema names that problem)."""
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        return ipaddress.IPv4Address(0)


def approve(config: Config, actor: str, macs: list[str] | None, names: str,
            ipaddr: str | None = None, profile: str | None = None, *, sort: str | None = None,
            netdev: str = "eth0", gateway: str | None = None) -> list[Machine]:
    """Make nodes of the chosen machines (see chosen_machines) with names and addresses from
    the sequence (see assignments), in one inventory write; then mark them approved and
    keep their facts as the new nodes' facts."""
    chosen = chosen_machines(config, macs, sort)
    pairs = assignments(config, len(chosen), names, ipaddr)
    if profile is None and "default" in snapshot(config).inventory.profiles:
        profile = "default"  # as `node add` does
    records = {name: node_record(m, address, profile, netdev, gateway)
               for m, (name, address) in zip(chosen, pairs)}
    write_records(config, actor, NODES, "create", list(records),
                  lambda name, _: records[name], create=True)
    outcomes = {m.mac: name for m, (name, _) in zip(chosen, pairs)}
    decided = book.decide(config, outcomes, MachineState.APPROVED, actor)
    for machine in decided:
        record_facts(config, machine.node, machine.facts, machine.last_seen)
        emit(config, "discovery.approved", machine.mac, {"node": machine.node, "by": actor})
    audit(config, actor, "discovery.approve", f"node:{fold(list(records))}",
          [f"{m}={n}" for m, n in outcomes.items()])
    return decided


def node_record(machine: Machine, address: str | None, profile: str | None, netdev: str,
                gateway: str | None):
    device = {"mac": machine.mac, **({"ipaddr": address} if address else {}),
              **({"gateway": gateway} if gateway else {})}
    data = {"netdevs": {netdev: device}, **({"profiles": [profile]} if profile else {}),
            "comment": f"discovered {machine.facts.dmi.product or 'machine'} "
                       f"{machine.facts.dmi.serial or machine.mac}"}
    return parse_record(data, f"node for {machine.mac}")


def reject(config: Config, actor: str, macs: list[str]) -> list[Machine]:
    """Mark machines rejected: their next poll tells them to power off."""
    macs = [check_mac(m, "macs") for m in macs]
    machines = book.read_book(config).machines
    for mac in macs:
        if mac not in machines:
            _missing(mac)
    nodes = node_macs(config)
    held = [f"{mac} (node {nodes[mac]})" for mac in macs if mac in nodes]
    if held:  # it would reboot as its node whatever the book said
        raise InvalidInput(f"a node has the MAC: {', '.join(held)}; delete the node to "
                           "reject the machine", field="macs")
    decided = book.decide(config, dict.fromkeys(macs), MachineState.REJECTED, actor)
    for machine in decided:
        emit(config, "discovery.rejected", machine.mac, {"by": actor})
    audit(config, actor, "discovery.reject", "machines", macs)
    return decided


def check_rules(config: Config, path=None) -> list[Rule]:
    """The rules of `path` (default: the state dir's), each also checked against this
    inventory and discovery.pool: a profile the inventory lacks, or addresses the pool
    leases, fail every approval by the rule (its machines only wait), so they are refused
    here (the server, reading the rules at each report, applies the others)."""
    rules = load_rules(config, path)
    profiles = snapshot(config).inventory.profiles
    for index, rule in enumerate(rules, 1):
        try:
            if rule.profile is not None and rule.profile not in profiles:
                raise InvalidInput(f"profile {rule.profile} does not exist")
            if rule.ipaddr is not None:
                count = len(expand_names(rule.names))
                check_outside_pool(config, consecutive(rule.ipaddr, count, "ipaddr"))
        except InvalidInput as exc:
            raise InvalidInput(f"{path or rules_path(config)}: rule {index} ({rule.name}): "
                               f"{exc}") from None
    return rules


def list_sightings(config: Config, mac: str | None = None, *, limit: int = 100,
                   after: str | None = None) -> tuple[list[dict], str | None]:
    """A page of DHCP sightings of unknown MACs (only `mac`'s when given), oldest first, and
    the next page's cursor (its position in the log)."""
    mac = check_mac(mac) if mac is not None else None
    start = decode_cursor(after, int) or 0
    check_limit(limit)
    records = read_discovery(config)
    found, position = [], start
    for position in range(start, len(records)):
        if mac is None or records[position].get("mac") == mac:
            found.append(records[position])
            if len(found) == limit:
                break
    more = len(found) == limit and position + 1 < len(records)
    return found, encode_cursor(position + 1) if more else None


def node_reported(config: Config, node: str, facts: Facts) -> NodeFacts:
    """A known node's facts, reported by its agent at boot: kept, and an event."""
    stored = record_facts(config, node, facts)
    emit(config, "node.facts", node, {"threads": facts.cpu.threads,
                                      "memory_mib": facts.memory_mib})
    return stored


def node_facts(config: Config, node: str) -> NodeFacts:
    """A node's last facts; NotFound for a node that is not in the inventory or never
    reported."""
    if node not in snapshot(config).inventory.nodes:
        raise NodeNotFound(f"no node named {node!r}")
    stored = facts_of(config, node)
    if stored is None:
        raise NotFound(f"node {node} has reported no facts yet (its agent reports them "
                       "at each boot)")
    return stored
