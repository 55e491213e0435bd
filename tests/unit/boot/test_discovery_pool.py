"""Discovery on the boot side: the pool's leases, the DHCP server leasing unknown MACs from
it (in-process on loopback, relayed), and the discovery image's iPXE script."""

from __future__ import annotations

import socket

import pytest

from bootdata import add_image, add_nodes, ip_of, mac_of, relayed
from provisiond.api import create_app
from provisiond.boot import dhcp_packet as p
from provisiond.boot.dhcp import DhcpServer
from provisiond.boot.discovery import DiscoveryLog, DiscoveryPool, read_discovery
from provisiond.boot.table import build_table
from provisiond.boot.udp import open_udp
from provisiond.state.layout import Layout

STRANGER = "52:54:00:ee:00:01"


@pytest.fixture
def pool_config(config):
    config.dhcp.discovery = True
    config.discovery.pool = "10.99.9.1-10.99.9.3"
    config.discovery.gateway = "10.99.0.1"
    return config


def test_a_mac_keeps_its_address_a_new_one_takes_a_free_one_and_a_full_pool_gives_none(
        pool_config):
    pool = DiscoveryPool(pool_config)
    reserved = {"10.99.9.1": object()}  # a node's address is never leased
    assert pool.offer("a", reserved, now=0) == "10.99.9.2"
    assert pool.offer("b", reserved, now=0) == "10.99.9.3"
    assert pool.offer("a", reserved, now=10) == "10.99.9.2"
    assert pool.offer("c", reserved, now=10) is None  # full
    assert pool.holds("a", "10.99.9.2", now=10) and not pool.holds("a", "10.99.9.3", now=10)
    later = pool_config.discovery.lease_seconds + 20
    assert pool.offer("c", reserved, now=later) == "10.99.9.2"  # a's lease ran out
    assert not pool.holds("a", "10.99.9.2", now=later)
    assert pool.offer("a", reserved, now=later) == "10.99.9.3"


def test_the_dhcp_server_leases_an_unknown_mac_from_the_pool(pool_config):
    add_nodes(pool_config, 2, gateway="10.99.0.1")
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    client.settimeout(2)
    server = DhcpServer(pool_config, build_table(pool_config), sock=open_udp("127.0.0.1", 0))
    server.client_port = server.relay_port = client.getsockname()[1]
    server.start()
    try:
        def ask(packet):
            client.sendto(packet, server.sock.getsockname())
            return p.decode_reply(client.recvfrom(2048)[0])

        yiaddr, _, bootfile, opts = ask(relayed(STRANGER, p.DISCOVER))
        assert (yiaddr, bootfile) == ("10.99.9.1", b"undionly.kpxe")
        assert opts[p.OPT_MSG_TYPE] == bytes((p.OFFER,))
        assert opts[p.OPT_LEASE] == pool_config.discovery.lease_seconds.to_bytes(4, "big")
        assert opts[p.OPT_ROUTER] == socket.inet_aton("10.99.0.1")
        ours = (p.OPT_SERVER_ID, socket.inet_aton("127.0.0.1"))
        ack = ask(relayed(STRANGER, p.REQUEST,
                          (p.OPT_REQUESTED_IP, socket.inet_aton("10.99.9.1")), ours))
        assert ack[0] == "10.99.9.1" and ack[3][p.OPT_MSG_TYPE] == bytes((p.ACK,))
        nak = ask(relayed(STRANGER, p.REQUEST,
                          (p.OPT_REQUESTED_IP, socket.inet_aton("10.99.9.2")), ours))
        assert nak[3][p.OPT_MSG_TYPE] == bytes((p.NAK,))
        known = ask(relayed(mac_of(1), p.DISCOVER))  # nodes keep their own addresses
        assert known[0] == ip_of(1)
    finally:
        server.close()
        client.close()


def test_without_a_pool_unknown_macs_get_no_lease(config):
    config.dhcp.discovery = True
    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    assert server.pool is None
    server.close()


def test_an_unknown_mac_gets_the_discovery_image_only_while_discovery_is_on(pool_config):
    add_image(pool_config, "discovery")
    client = create_app(pool_config).test_client()
    script = client.get(f"/boot/ipxe/{STRANGER}").get_data(as_text=True)
    assert "provisiond.discover=52:54:00:ee:00:01" in script and "/blobs/sha256/" in script
    assert "provisiond.token" not in script and "/overlays/" not in script
    pool_config.discovery.pool = None
    plain = create_app(pool_config).test_client().get(f"/boot/ipxe/{STRANGER}")
    assert "unknown MAC" in plain.get_data(as_text=True)


def test_an_unbuilt_discovery_image_is_a_retry_script(pool_config):
    client = create_app(pool_config).test_client()
    script = client.get(f"/boot/ipxe/{STRANGER}").get_data(as_text=True)
    assert "discovery of 52:54:00:ee:00:01" in script and "sleep" in script


class CountingReserved(dict):
    """The boot table's by_ip, counting the pool's look-ups in it."""

    looks = 0

    def __contains__(self, key) -> bool:
        self.looks += 1
        return super().__contains__(key)


def test_a_full_pool_answers_new_macs_without_scanning_it_again(pool_config):
    """Each DISCOVER from a new (spoofed) MAC scanned the whole pool (up to 65536
    addresses) while it was full: a flood of them starved the one DHCP loop, and with it the
    nodes' own leases. Until a lease can run out (or one is given back), full is full."""
    pool_config.discovery.pool, pool_config.discovery.netmask = "10.99.9.1-10.99.12.255", \
        "255.255.0.0"
    pool = DiscoveryPool(pool_config)
    reserved = CountingReserved()
    for i, _ in enumerate(pool.addresses):
        assert pool.offer(f"m{i}", reserved, now=i / 1000) is not None
    assert pool.offer("new", reserved, now=10) is None
    looks = reserved.looks
    for i in range(100):
        assert pool.offer(f"spoof{i}", reserved, now=10) is None
    assert reserved.looks - looks < 100 * 10
    pool.release("m5")
    assert pool.offer("new", reserved, now=10) is not None  # given back: taken at once
    assert pool.offer("next", reserved, now=10) is None
    later = pool_config.discovery.lease_seconds + 0.001  # m0's lease ran out
    assert pool.offer("next", reserved, now=later) is not None
    assert pool.offer("next", {**reserved, "10.99.9.1": object()}, now=later) is not None


def test_the_sightings_log_of_a_flood_of_new_macs_stays_bounded(config):
    """One host sending DHCP requests from new MACs (20 lines a second pass the rate
    limit) grew discovery.jsonl without end, about 170 MB a day, and every
    GET /api/v1/discovery/sightings read and checked the whole of it."""
    log = DiscoveryLog(config, per_mac=0, per_second=100_000, max_bytes=4096)
    macs = [f"02:00:00:00:{i >> 8:02x}:{i & 255:02x}" for i in range(1000)]
    for mac in macs:
        assert log.note(mac, arch=0, vendor_class="PXEClient", relay="0.0.0.0")
    sightings = Layout.of(config).sightings
    older = sightings.with_name(sightings.name + ".1")
    assert sightings.stat().st_size <= 4096 and older.stat().st_size <= 4096 + 200
    kept = [s["mac"] for s in read_discovery(config)]
    assert 30 < len(kept) < 100 and kept == macs[-len(kept):]  # the newest, in order
    assert DiscoveryLog(config).max_bytes == 8 << 20  # the server's: about 80,000 lines
