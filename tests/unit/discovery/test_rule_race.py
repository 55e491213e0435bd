"""Rules approving machines that report at once (a rack powered on together): each HTTP
worker picks the first free name of the rule's sequence from what it read, so two of them
pick the same; the one that writes second must take the next free name, as often as it
takes, and never leave its machine waiting while the sequence has names left."""

from __future__ import annotations

import multiprocessing

import pytest

from provisiond.discovery.facts import Facts
from provisiond.discovery.machines import MachineState, read_book
from provisiond.discovery.rules import rules_path
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.service import discovery, records

FACTS = Facts.model_validate({"cpu": {"sockets": 1, "cores": 2, "threads": 4},
                              "memory_mib": 2048, "dmi": {"product": "PowerEdge R650"}})
MACHINES = 40


def mac(i: int) -> str:
    return f"52:54:00:bb:00:{i:02x}"


@pytest.fixture
def rule_config(config):
    config.dhcp.discovery = True
    config.discovery.pool = "10.99.200.1-10.99.200.250"
    with InventoryStore(config).edit() as inv:
        inv.profiles["default"] = Record()
    rules_path(config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(config).write_text("- name: r650\n  match: {dmi.product: 'PowerEdge R650'}\n"
                                  "  names: n[001-100]\n  ipaddr: 10.10.0.1\n")
    return config


def _report_when_all_are_ready(config, barrier, i: int) -> None:
    barrier.wait(30)
    discovery.report(config, mac(i), f"10.99.200.{i}", FACTS)


def test_machines_reporting_at_once_are_all_approved_with_names_of_their_own(rule_config):
    """40 processes, as 40 workers' requests: 1 to 5 machines were left pending with 'rule
    r650: node n011 already exists' in about half the runs (5 tries each)."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(MACHINES)
    workers = [context.Process(target=_report_when_all_are_ready, args=(rule_config, barrier, i))
               for i in range(1, MACHINES + 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    book = read_book(rule_config).machines
    assert {m.state for m in book.values()} == {MachineState.APPROVED}, [
        (m.mac, m.problem) for m in book.values() if m.problem]
    nodes = InventoryStore(rule_config).read().nodes
    assert sorted(nodes) == [f"n{i:03d}" for i in range(1, MACHINES + 1)]
    assert {nodes[m.node].netdevs["eth0"].mac for m in book.values()} == set(book)


def test_a_rule_takes_the_next_free_name_however_often_another_writer_was_first(
        rule_config, monkeypatch):
    """Another writer (a worker, `node add`) takes the name chosen, eight times over."""
    write = records.write_records
    taken = []

    def another_writer_first(config, actor, kind, action, names, change, **options):
        if len(taken) < 8:
            taken.extend(names)
            write(config, "cli:other", kind, action, names,
                  lambda name, _: Record(comment="someone else's"), create=True)
        return write(config, actor, kind, action, names, change, **options)

    monkeypatch.setattr(discovery, "write_records", another_writer_first)
    machine = discovery.report(rule_config, mac(1), "10.99.200.1", FACTS)
    assert taken == [f"n{i:03d}" for i in range(1, 9)]
    assert (machine.state, machine.node, machine.problem) == (MachineState.APPROVED, "n009",
                                                              None)
