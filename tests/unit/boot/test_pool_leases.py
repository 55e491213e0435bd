"""The discovery pool's leases across a `serve` restart: a new DhcpServer on the same state
dir holds what the last one leased (in-process on loopback, relayed), as dnsmasq and Kea do
with their lease files."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time

import pytest

from bootdata import add_nodes, ip_of, mac_of, relayed
from provisiond.boot import dhcp_packet as p
from provisiond.boot.dhcp import DhcpServer
from provisiond.boot.table import build_table
from provisiond.boot.udp import open_udp
from provisiond.discovery import machines as book
from provisiond.discovery.facts import Facts
from provisiond.state.layout import Layout

WAITING, NEWCOMER = "52:54:00:ee:00:01", "52:54:00:ee:00:02"
OURS = (p.OPT_SERVER_ID, socket.inet_aton("127.0.0.1"))
FACTS = Facts.model_validate({"cpu": {"sockets": 1, "cores": 4, "threads": 8},
                              "memory_mib": 8192})


@pytest.fixture
def pool_config(config):
    config.dhcp.discovery = True
    config.discovery.pool = "10.99.9.1-10.99.9.3"
    add_nodes(config, 1)
    return config


@contextlib.contextmanager
def serving(config):
    """A DhcpServer on the state dir (a `serve` run) and a function sending it a packet and
    returning the decoded reply; closed (its leases saved) when the block ends."""
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    client.settimeout(2)
    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    server.client_port = server.relay_port = client.getsockname()[1]
    server.start()

    def ask(packet: bytes):
        client.sendto(packet, server.sock.getsockname())
        return p.decode_reply(client.recvfrom(2048)[0])
    try:
        yield ask
    finally:
        server.close()
        client.close()


def lease(ask, mac: str) -> str:
    """DISCOVER, then REQUEST of the offered address: the address ACKed."""
    offered = ask(relayed(mac, p.DISCOVER))[0]
    return renew(ask, mac, offered)


def renew(ask, mac: str, address: str) -> str | None:
    """REQUEST of `address`: it, ACKed, or None (NAKed)."""
    yiaddr, _, _, opts = ask(relayed(mac, p.REQUEST, (p.OPT_REQUESTED_IP,
                                                      socket.inet_aton(address)), OURS))
    return yiaddr if opts[p.OPT_MSG_TYPE] == bytes((p.ACK,)) else None


def test_a_restarted_server_offers_no_new_machine_the_address_a_waiting_one_holds(
        pool_config):
    """The pool's leases lived in memory only: after a restart the first new machine was
    offered 10.99.9.1, which the waiting machine still held (two machines, one address),
    and the waiting machine's renewal of it was NAKed."""
    with serving(pool_config) as ask:
        assert lease(ask, WAITING) == "10.99.9.1"
    with serving(pool_config) as ask:
        assert lease(ask, NEWCOMER) == "10.99.9.2"
        assert renew(ask, WAITING, "10.99.9.1") == "10.99.9.1"
    saved = json.loads(Layout.of(pool_config).leases.read_text())
    assert {mac: lease["ip"] for mac, lease in saved.items()} == {
        WAITING: "10.99.9.1", NEWCOMER: "10.99.9.2"}


def test_expired_and_foreign_leases_are_not_revived(pool_config):
    """A lease that ran out while serve was down frees its address; one of an address the
    pool (as configured now) does not hold is no pool lease."""
    now = time.time()
    Layout.of(pool_config).leases.write_text(json.dumps({
        WAITING: {"ip": "10.99.9.1", "expires": int(now - 5)},
        "52:54:00:ee:00:03": {"ip": "10.99.8.1", "expires": int(now + 600)}}))
    with serving(pool_config) as ask:
        assert lease(ask, NEWCOMER) == "10.99.9.1"
        assert renew(ask, WAITING, "10.99.9.1") is None


def test_a_node_leasing_its_own_address_frees_its_pool_address(pool_config):
    """Approved while serve was down, the machine boots as its node: the pool address it
    held is free once it has its own (the lease file has one lease per MAC)."""
    Layout.of(pool_config).leases.write_text(json.dumps({
        mac_of(1): {"ip": "10.99.9.1", "expires": int(time.time() + 600)}}))
    with serving(pool_config) as ask:
        assert lease(ask, NEWCOMER) == "10.99.9.2"
        assert lease(ask, mac_of(1)) == ip_of(1)
        assert lease(ask, "52:54:00:ee:00:03") == "10.99.9.1"
    saved = json.loads(Layout.of(pool_config).leases.read_text())
    assert saved[mac_of(1)]["ip"] == ip_of(1)


def waiting_in_the_book(config, mac: str, address: str) -> None:
    now = time.time()
    with book.edit_book(config) as machines:
        machines.machines[mac] = book.Machine(mac=mac, seq=1, first_seen=now, last_seen=now,
                                              address=address, facts=FACTS)


@pytest.mark.parametrize("damage", [b"{\"52:54:00:ee:00:01\": {\"ip\": ", b"[1, 2]",
                                    b"\xff\xfe", None])
def test_a_damaged_lease_file_is_one_line_and_waiting_machines_keep_their_addresses(
        pool_config, caplog, damage):
    """A lease file that cannot be read (cut short, not the model, not UTF-8, a directory)
    stops nothing: one error line, and the addresses the book's waiting machines reported
    from are held for one lease time. A save that fails at stop is one line too (it was an
    OSError out of the supervisor's stop, before the other servers were closed)."""
    path = Layout.of(pool_config).leases
    if damage is None:
        path.mkdir()
    else:
        path.write_bytes(damage)
    waiting_in_the_book(pool_config, WAITING, "10.99.9.1")
    with caplog.at_level(logging.ERROR, logger="provisiond.boot"), serving(pool_config) as ask:
        assert lease(ask, NEWCOMER) == "10.99.9.2"
        assert renew(ask, WAITING, "10.99.9.1") == "10.99.9.1"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
              and r.exc_info is None and "\n" not in r.getMessage()]
    assert len(errors) == len(caplog.records)
    assert [e for e in errors if "leases not read back" in e] == errors[:1]
    # the directory in the way also fails the saves (a tick's, the one at stop): lines, not
    # tracebacks
    saves = [e for e in errors[1:] if "housekeeping failed" in e or "not saved at stop" in e]
    assert saves == errors[1:] and bool(saves) == (damage is None), errors


def test_the_pool_restores_only_unexpired_leases_of_its_own_addresses(pool_config):
    from provisiond.boot.discovery import DiscoveryPool

    pool = DiscoveryPool(pool_config)
    assert pool.restore("a", "10.99.9.2", expires=100, now=50)
    assert not pool.restore("b", "10.99.9.2", expires=100, now=50)  # held already
    assert not pool.restore("c", "10.99.9.3", expires=50, now=50)   # ran out
    assert not pool.restore("d", "10.99.10.1", expires=100, now=50)  # not the pool's
    assert pool.offer("e", {}, now=60) == "10.99.9.1"
    assert pool.offer("f", {}, now=60) == "10.99.9.3"
    assert pool.offer("a", {}, now=60) == "10.99.9.2"
    assert pool.current(now=60) == {"a": ("10.99.9.2", 60 + pool.seconds),
                                    "e": ("10.99.9.1", 60 + pool.seconds),
                                    "f": ("10.99.9.3", 60 + pool.seconds)}


def test_a_node_ack_keeps_a_full_pool_full(pool_config):
    """Every node's ACK now gives up its MAC's pool lease: one without any must not drop
    the pool's "full" mark (a flood of new MACs would scan the pool again per node ACK)."""
    from provisiond.boot.discovery import DiscoveryPool

    pool, reserved = DiscoveryPool(pool_config), {}
    for mac in ("a", "b", "c"):
        assert pool.offer(mac, reserved, now=0) is not None
    assert pool.offer("d", reserved, now=0) is None and pool.full is not None
    pool.release(mac_of(1))
    assert pool.full is not None
    pool.release("a")
    assert pool.full is None and pool.offer("d", reserved, now=0) == "10.99.9.1"


def test_a_lease_file_of_an_older_release_still_holds_the_waiting_machines_addresses(
        pool_config):
    """The release before saved the nodes' leases only: read back whole, it counted as
    'saved leases', so the book's waiting machines were not held and a new machine was
    offered the address one of them still used, at the first restart after the upgrade."""
    Layout.of(pool_config).leases.write_text(json.dumps({
        mac_of(1): {"ip": ip_of(1), "expires": int(time.time() + 600)}}))
    waiting_in_the_book(pool_config, WAITING, "10.99.9.1")
    with serving(pool_config) as ask:
        assert lease(ask, NEWCOMER) == "10.99.9.2"
        assert renew(ask, WAITING, "10.99.9.1") == "10.99.9.1"


def test_a_machine_in_the_pool_keeps_its_pool_lease_over_the_node_lease_it_had(pool_config):
    """A node deleted to be enlisted again still had its node lease when it took a pool
    address: the file kept the node's address for its MAC, and after a restart the pool
    address it was waiting with went to a new machine."""
    Layout.of(pool_config).leases.write_text(json.dumps({
        WAITING: {"ip": ip_of(1), "expires": int(time.time() + 3600)}}))
    with serving(pool_config) as ask:
        assert lease(ask, WAITING) == "10.99.9.1"  # no node has this MAC (any more)
    saved = json.loads(Layout.of(pool_config).leases.read_text())
    assert saved[WAITING]["ip"] == "10.99.9.1"
    with serving(pool_config) as ask:
        assert lease(ask, NEWCOMER) == "10.99.9.2"
