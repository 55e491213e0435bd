"""One bad record never stops a boot service: builders skip it with one log line, servers
keep their last good table, UDP loops survive, and the loaded inventory is validated.

Records are made with pydantic's model_construct or written as YAML by hand, bypassing the
schema the way a hand edit or an older provisiond could."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time

import pytest
from dnslib import DNSRecord, QTYPE, RCODE

from bootdata import add_nodes, ip_of, mac_of
from provisiond.boot import dhcp_packet as p
from provisiond.boot.dhcp_reply import Answers
from provisiond.boot.dns import DnsServer
from provisiond.boot.dns_zone import Zone
from provisiond.boot.table import (SkippedRecords, TableWatcher, build_table, index_nodes,
                                   reverse_name)
from provisiond.boot.udp import UdpServer, open_udp
from provisiond.inventory.merge import Node
from provisiond.inventory.model import NetDev, Record

BAD_IPV6 = ["fe80::1%eth0", "::ffff:10.0.0.5", "fd00::zz", "10.0.0.9", "64:ff9b::10.0.0.5.1"]


def node(name: str, **netdev) -> Node:
    """A merged node built around the schema (model_construct validates nothing)."""
    return Node(name, Record.model_construct(netdevs={"eth0": NetDev.model_construct(
        **{"mac": None, "ipaddr": None, "netmask": None, "gateway": None, "ipaddr6": None,
           "primary": None, **netdev})}))


def good(index: int) -> Node:
    return node(f"n{index}", mac=mac_of(index), ipaddr=ip_of(index), ipaddr6=f"fd00::{index}")


def ask(zone: Zone, name: str, qtype: str = "A"):
    return zone.records.get((name, getattr(QTYPE, qtype)), [])


@pytest.mark.parametrize("bad", BAD_IPV6)
def test_zone_skips_a_node_whose_ipv6_dnslib_cannot_encode(config, caplog, bad):
    """Each of these raised inside dnslib and ended `serve` (or its start, with a
    traceback); now the node is left out, named in one error line, the others answered."""
    nodes = {n.name: n for n in (good(1), node("n3", mac=mac_of(3), ipaddr=ip_of(3),
                                                  ipaddr6=bad), good(2))}
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        zone = Zone(config, index_nodes(nodes))
    assert [str(rr.rdata) for rr in ask(zone, "n2.cluster")] == [ip_of(2)]
    assert [str(rr.rdata) for rr in ask(zone, "n1", "AAAA")] == ["fd00::1"]
    assert not ask(zone, "n3") and not ask(zone, "n3.cluster", "AAAA")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "node n3" in lines[0] and "skipped 1 bad record" in lines[0]


def test_zone_encodes_embedded_ipv4_forms_itself(config):
    """64:ff9b::a00:5 written with a dotted tail is a valid (NAT64) address that dnslib
    misparsed, ending serve; it is now served as it is."""
    from provisiond.boot.dns_zone import packed

    assert bytes(packed("64:ff9b::10.0.0.5", 6)) == socket.inet_pton(socket.AF_INET6,
                                                                      "64:ff9b::a00:5")
    zone = Zone(config, index_nodes({"n6": node("n6", ipaddr6="64:ff9b::10.0.0.5")}))
    assert [str(rr.rdata) for rr in ask(zone, "n6", "AAAA")] == ["64:ff9b::a00:5"]


def test_zone_skips_a_bad_ipv4_ptr_but_keeps_the_rest(config, caplog):
    nodes = {n.name: n for n in (good(1), node("n4", mac=mac_of(4), ipaddr="10.1"))}
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        zone = Zone(config, index_nodes(nodes))
    assert [str(rr.rdata) for rr in ask(zone, "3.0.99.10.in-addr.arpa", "PTR")] == [
        "n1.cluster."]
    assert "node n4" in caplog.text


@pytest.mark.parametrize("field, value", [
    ("ipaddr", "10.1"), ("ipaddr", "10.0.0.300"), ("netmask", "255.255.0"),
    ("gateway", "gw"), ("mac", "52:54:00:00:00"),
])
def test_dhcp_answers_skip_a_record_they_cannot_pack(config, caplog, field, value):
    """inet_aton raised OSError for the whole table (DHCP did not start, or a reload ended
    serve); "10.1" it even took for 10.0.0.1. Now only that node goes unanswered."""
    bad = {"mac": mac_of(5), "ipaddr": ip_of(5), "netmask": "255.255.0.0", field: value}
    nodes = {n.name: n for n in (good(1), node("n5", **bad))}
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        answers = Answers(config, index_nodes(nodes))
    assert list(answers.entries) == [mac_of(1)]
    assert "node n5" in caplog.text
    reply = answers.reply(p.decode(p.encode_request(mac_of(1), p.DISCOVER)), p.OFFER)
    assert p.decode_reply(reply)[0] == ip_of(1)


def write_inventory(config, text: str) -> None:
    """A hand edit: a new file renamed in (as an editor or `git pull` does)."""
    tmp = config.inventory_path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, config.inventory_path)


def inventory_yaml(*nodes: tuple[str, str, str], profiles: str = "") -> str:
    lines = ["profiles: {" + profiles + "}", "nodes:"]
    for name, mac, ipaddr in nodes:
        lines += [f"  {name}:", "    netdevs:", f"      eth0: {{mac: '{mac}', ipaddr: {ipaddr}}}"]
    return "\n".join(lines) + "\n"


GOOD = inventory_yaml(("n1", mac_of(1), ip_of(1)), ("n2", mac_of(2), ip_of(2)))
BAD_EDITS = {
    "a duplicated address": (inventory_yaml(("n2", mac_of(2), ip_of(1)),
                                            ("n1", mac_of(1), ip_of(1))),
                             f"{ip_of(1)} is already used by node n"),
    "a duplicated MAC": (inventory_yaml(("n1", mac_of(1), ip_of(1)),
                                        ("n2", mac_of(1), ip_of(2))), "already used"),
    "an unknown profile": (GOOD.replace("  n2:\n", "  n2:\n    profiles: [nosuch]\n"),
                           "unknown profile 'nosuch'"),
    "not YAML": ("nodes: [", "not valid YAML"),
    "the server's own address": (inventory_yaml(("n1", mac_of(1), ip_of(1)),
                                                 ("n2", mac_of(2), "127.0.0.1")),
                                  "127.0.0.1 is already used by the server (server.address)"),
    "a duplicated node key": (GOOD + f"  n1:\n    netdevs:\n      eth0: {{mac: '{mac_of(9)}'}}\n",
                              "duplicate key 'n1'"),
    "a schema error": (GOOD.replace(ip_of(2), "10.0.0.999"), "invalid IPv4 address"),
}


@pytest.mark.parametrize("edit", BAD_EDITS)
def test_watcher_keeps_the_last_good_table_when_a_hand_edit_is_invalid(config, caplog, edit):
    """The server applies the CLI's checks to what it loads: a duplicated address made it
    hand n2's runtime overlay to n1, an unknown profile was ignored. Now the edit is
    refused in one line and the last good table is kept; the fix is picked up."""
    text, reason = BAD_EDITS[edit]
    write_inventory(config, GOOD)
    watcher = TableWatcher(config, interval=0)
    assert watcher.table.by_ip[ip_of(1)].node == "n1"
    write_inventory(config, text)
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        assert watcher.changed() is False
    assert watcher.table.by_ip[ip_of(1)].node == "n1"
    assert set(watcher.table.nodes) == {"n1", "n2"}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and reason in errors[0]
    assert "keeping the last good table (2 nodes)" in errors[0]
    assert "\n" not in errors[0]
    write_inventory(config, GOOD.replace(ip_of(2), ip_of(7)))
    assert watcher.changed() is True and watcher.table.by_ip[ip_of(7)].node == "n2"


def test_build_table_applies_the_cli_checks(config):
    from provisiond.errors import InvalidInventory

    write_inventory(config, BAD_EDITS["an unknown profile"][0])
    with pytest.raises(InvalidInventory, match="unknown profile"):
        build_table(config)


def test_an_inventory_invalid_at_start_serves_no_node_until_fixed(config, caplog):
    """The chosen behaviour (docs/decisions.md): start, serve no node, say so, pick up the fix."""
    write_inventory(config, BAD_EDITS["a duplicated address"][0])
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        watcher = TableWatcher(config, interval=0)
    assert watcher.table.nodes == {} and not watcher.valid
    assert "serving no nodes until it is fixed" in caplog.text
    write_inventory(config, GOOD)
    assert watcher.changed() and set(watcher.table.nodes) == {"n1", "n2"}


def test_a_server_that_cannot_take_a_table_keeps_its_last(config, monkeypatch, caplog):
    """The supervisor hands new tables to every UDP server; one raising (any bug) used to
    end `serve` and with it DHCP, TFTP, DNS and HTTP."""
    from provisiond.boot import dns as dns_module
    from provisiond.boot.supervisor import Supervisor

    add_nodes(config, 2)
    supervisor = Supervisor(config, {"http": False, "dhcp": False, "tftp": False, "dns": False})
    server = DnsServer(config, supervisor.watcher.table, sock=open_udp("127.0.0.1", 0))
    supervisor.udp.append(server)
    server.start()
    try:
        def broken(*_):
            raise ValueError("invalid literal for int() with base 16: '10.0.0.5'")

        monkeypatch.setattr(dns_module, "Zone", broken)
        with caplog.at_level(logging.ERROR, "provisiond.boot"):
            supervisor._update_tables()
        assert "dns: table not updated, keeping the previous one" in caplog.text
        assert caplog.records[-1].exc_info, "a bug caught here is logged with its traceback"
        host, port = server.sock.getsockname()
        reply = DNSRecord.parse(DNSRecord.question("n2.cluster").send(host, port, timeout=2))
        assert reply.header.rcode == RCODE.NOERROR and str(reply.rr[0].rdata) == ip_of(2)
    finally:
        server.close()


class FlakyServer(UdpServer):
    """Echoes packets; its housekeeping fails once, as a full disk fails a leases write."""

    name = "flaky"
    tick_seconds = 0.05

    def __init__(self, sock):
        super().__init__(sock)
        self.ticks = 0

    def handle(self, data: bytes, peer: tuple) -> None:
        self.sock.sendto(data, peer)

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks == 1:
            raise OSError(28, "No space left on device")


def test_a_failing_tick_does_not_end_the_udp_loop(caplog):
    server = FlakyServer(open_udp("127.0.0.1", 0))
    server.start()
    try:
        deadline = time.monotonic() + 5
        while server.ticks < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(2)
            client.sendto(b"ping", server.sock.getsockname())
            assert client.recvfrom(10)[0] == b"ping"
        assert server.errors == 1 and server._thread.is_alive()
    finally:
        server.close()


class SelfFeedingServer(UdpServer):
    """Sends each packet back to itself, so its socket never waits `tick_seconds` for one:
    a DNS or DHCP server under steady load. Stops feeding after FEED packets."""

    name = "busy"
    tick_seconds = 0.05
    FEED = 50_000

    def __init__(self, sock):
        super().__init__(sock)
        self.handled = 0
        self.handled_at_first_tick: int | None = None

    def handle(self, data: bytes, peer: tuple) -> None:
        self.handled += 1
        if self.handled < self.FEED:
            self.sock.sendto(data, self.address)

    def tick(self) -> None:
        if self.handled_at_first_tick is None:
            self.handled_at_first_tick = self.handled


def test_housekeeping_runs_while_packets_keep_coming():
    """tick() ran only when a receive timed out: under steady traffic the DHCP leases were
    never written and the DNS forwarder never expired lost queries (at 4096 in flight it
    then forwarded nothing). Now it runs every tick_seconds, busy or not."""
    server = SelfFeedingServer(open_udp("127.0.0.1", 0))
    server.start()
    try:
        server.sock.sendto(b"go", server.address)
        deadline = time.monotonic() + 60
        while server.handled_at_first_tick is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.handled_at_first_tick is not None, "no tick at all"
        assert server.handled_at_first_tick < server.FEED, "ticked only once traffic stopped"
    finally:
        server.close()


def test_a_record_skipped_by_a_bug_is_logged_with_its_traceback(caplog):
    """SkippedRecords took any exception for a bad record: a bug in a builder (here an
    AttributeError) skipped every node as "bad" with no traceback anywhere. Bad data stays
    one line; a bug adds its traceback to the server log."""
    bad_data = SkippedRecords("dns zone")
    bad_data.build("node n1", lambda: ipaddress.ip_address("10.1"))
    bug = SkippedRecords("dns zone")
    bug.build("node n1", lambda: ipaddress.ip_address("10.1"))
    bug.build("node n2", lambda: None.primary_netdev)
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        bad_data.report()
        bug.report()
    first, second = caplog.records
    assert first.exc_info is None and "node n1" in first.getMessage()
    assert second.exc_info and second.exc_info[0] is AttributeError
    assert "skipped 2 bad record(s)" in second.getMessage()


def test_a_table_build_failing_by_a_bug_is_logged_with_its_traceback(config, caplog,
                                                                     monkeypatch):
    from provisiond.boot import table as table_module

    add_nodes(config, 1)
    watcher = TableWatcher(config, interval=0)
    monkeypatch.setattr(table_module, "build_table", lambda config, previous=None: {}["a bug"])
    write_inventory(config, GOOD)
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        assert watcher.changed() is False
    assert "keeping the last good table (1 nodes): KeyError" in caplog.records[-1].getMessage()
    assert caplog.records[-1].exc_info[0] is KeyError
    monkeypatch.undo()
    write_inventory(config, BAD_EDITS["an unknown profile"][0])
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        watcher.changed()
    assert caplog.records[-1].exc_info is None  # an invalid file: one line, no traceback


class FailingServer(UdpServer):
    """Its housekeeping fails FAILS times in a row; every packet raises `error`."""

    name = "failing"
    tick_seconds = 0.02
    FAILS = 5

    def __init__(self, sock, error: Exception):
        super().__init__(sock)
        self.error = error
        self.ticks = 0

    def handle(self, data: bytes, peer: tuple) -> None:
        raise self.error

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks <= self.FAILS:
            raise OSError(28, "No space left on device")


def wait_for(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


@pytest.mark.parametrize("error, logged", [(KeyError("a bug"), 1), (
    p.MalformedPacket("not a DHCP packet"), 0)])
def test_a_failing_tick_or_packet_is_logged_once(caplog, error, logged):
    """A failing tick logged an error every tick for as long as it failed (a full disk:
    a line a second, forever); a packet raising a bug was a debug line only. Now a tick
    failure is one line when it starts and one when it ends, and a bug in handle() is
    logged with its traceback once per exception type; malformed packets stay debug."""
    server = FailingServer(open_udp("127.0.0.1", 0), error)
    with caplog.at_level(logging.INFO, "provisiond.boot"):
        server.start()
        try:
            wait_for(lambda: server.ticks > FailingServer.FAILS)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                for _ in range(3):
                    client.sendto(b"x", server.address)
            wait_for(lambda: server.errors == FailingServer.FAILS + 3)
        finally:
            server.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("No space left" in r.getMessage() for r in errors) == 1
    assert [r.getMessage() for r in errors[:1]] == [
        "failing: housekeeping failed, retrying every 0.02s: OSError: "
        "[Errno 28] No space left on device"]
    assert errors[0].exc_info is None  # an OSError is not a bug
    assert "housekeeping works again (5 failed attempts)" in caplog.text
    bugs = errors[1:]
    assert len(bugs) == logged and all(r.exc_info[0] is KeyError for r in bugs)


def test_a_node_named_like_the_server_does_not_take_its_dns_name(config, caplog):
    """`node add provisiond` is accepted; provisiond.cluster (the zone's NS, the server's
    name in every node's hosts file) then answered the server's address and the node's,
    in turn. The node is left out of the zone, in one line; the server keeps its name."""
    nodes = {n.name: n for n in (good(1), node("provisiond", mac=mac_of(9), ipaddr=ip_of(9)))}
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        zone = Zone(config, index_nodes(nodes))
    assert [str(rr.rdata) for rr in ask(zone, "provisiond.cluster")] == [
        config.server.address]
    assert [str(rr.rdata) for rr in ask(zone, "n1")] == [ip_of(1)]
    assert not ask(zone, reverse_name(ip_of(9)), "PTR")  # no PTR to the server's name
    assert "node provisiond" in caplog.text and "this server's name" in caplog.text


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_an_inventory_deleted_or_truncated_while_serving_keeps_the_last_table(
        config, caplog, how):
    """`rm inventory.yaml`, a `git checkout` in progress, or `> inventory.yaml` (an editor
    writing in place starts so) made the server drop every node at once: a missing or
    empty file read as an empty cluster. The CLI never writes either; now they are
    refused like any invalid edit, and the file coming back is picked up."""
    write_inventory(config, GOOD)
    watcher = TableWatcher(config, interval=0)
    if how == "deleted":
        config.inventory_path.unlink()
    else:
        config.inventory_path.write_text("")
    with caplog.at_level(logging.ERROR, "provisiond.boot"):
        assert watcher.changed() is False
    assert set(watcher.table.nodes) == {"n1", "n2"}
    assert "keeping the last good table (2 nodes)" in caplog.text
    write_inventory(config, GOOD.replace(ip_of(2), ip_of(7)))
    assert watcher.changed() is True and watcher.table.by_ip[ip_of(7)].node == "n2"
