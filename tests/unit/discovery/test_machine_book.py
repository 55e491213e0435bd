"""The book of discovered machines as the HTTP workers read it: every waiting machine asks
what to do every 10 s, so at discovery.max_pending (1000) waiting there are 100 polls a
second, each reading the book."""

from __future__ import annotations

import time

from provisiond.discovery import machines as book
from provisiond.discovery.facts import Facts
from provisiond.service import discovery

FACTS = Facts.model_validate({
    "cpu": {"sockets": 2, "cores": 64, "threads": 128, "model": "AMD EPYC 7763 64-Core"},
    "memory_mib": 524288,
    "disks": [{"name": f"nvme{i}n1", "size_bytes": 3840755982336, "model": "MZQL23T8HCLS",
               "serial": f"S64HNE0R{i:06d}"} for i in range(4)],
    "nics": [{"name": f"eno{i}", "mac": f"b0:26:28:00:01:{i:02x}", "link": True,
              "speed_mbps": 25000} for i in range(4)],
    "dmi": {"vendor": "Dell Inc.", "product": "PowerEdge R6525", "serial": "ABCDEFG"}})


def mac(i: int) -> str:
    return f"52:54:00:cc:{i >> 8:02x}:{i & 255:02x}"


def fill(config, count: int) -> None:
    now = time.time()
    with book.edit_book(config) as machines:
        for i in range(count):
            machines.machines[mac(i)] = book.Machine(
                mac=mac(i), seq=i + 1, first_seen=now, last_seen=now, address="10.0.0.9",
                facts=FACTS)
        machines.next_seq = count + 1


def test_polls_of_a_thousand_waiting_machines_do_not_parse_the_book_each(config):
    """Each poll parsed the whole book (1.3 MB here): 52 ms, so 100 polls a second took
    5 s of CPU a second, and the boot requests of the same workers waited."""
    fill(config, 1000)
    started = time.perf_counter()
    for i in range(300):
        assert discovery.next_action(config, mac(i), None)["action"] == "wait"
    assert time.perf_counter() - started < 3.0  # 15 s when each poll parsed the book


def test_a_poll_sees_what_was_written_since(config):
    fill(config, 3)
    assert discovery.next_action(config, mac(1), None)["action"] == "wait"
    discovery.reject(config, "cli:root", [mac(1)])
    assert discovery.next_action(config, mac(1), None)["action"] == "poweroff"
    book.forget_machines(config, [mac(1)])
    assert discovery.next_action(config, mac(1), None)["action"] == "report"
    assert book.read_book(config).machines.keys() == {mac(0), mac(2)}
