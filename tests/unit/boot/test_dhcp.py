"""The DHCP server in-process on loopback: answers, NAKs, proxy mode, relays, junk."""

from __future__ import annotations

import random
import socket

import pytest

from bootdata import add_nodes, ip_of, mac_of, relayed
from provisiond.boot import dhcp_packet as p
from provisiond.boot.dhcp import DhcpServer
from provisiond.boot.table import build_table
from provisiond.boot.udp import open_udp
from provisiond.config import load_config
from tests.prometheus_text import by_label
from tests.waits import wait_until


@pytest.fixture
def client_sock():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2)
    yield sock
    sock.close()


def start(config, client_sock) -> DhcpServer:
    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    server.client_port = server.relay_port = client_sock.getsockname()[1]
    server.start()
    return server


@pytest.fixture
def server(config, client_sock):
    add_nodes(config, 3, gateway="10.99.0.1")
    server = start(config, client_sock)
    yield server
    server.close()


def exchange(server, client_sock, packet: bytes):
    client_sock.sendto(packet, server.sock.getsockname())
    return p.decode_reply(client_sock.recvfrom(2048)[0])


def test_offer_and_ack_through_a_relay(server, client_sock):
    yiaddr, siaddr, bootfile, opts = exchange(server, client_sock, relayed(
        mac_of(1), p.DISCOVER, (p.OPT_ARCH, b"\0\7")))
    assert (yiaddr, siaddr, bootfile) == (ip_of(1), "127.0.0.1", b"snponly.efi")
    assert opts[p.OPT_MSG_TYPE] == bytes((p.OFFER,)) and opts[p.OPT_HOSTNAME] == b"n1"
    assert opts[p.OPT_ROUTER] == socket.inet_aton("10.99.0.1")
    request = relayed(mac_of(1), p.REQUEST, (p.OPT_REQUESTED_IP, socket.inet_aton(ip_of(1))),
                      (p.OPT_SERVER_ID, socket.inet_aton("127.0.0.1")))
    _, _, _, opts = exchange(server, client_sock, request)
    assert opts[p.OPT_MSG_TYPE] == bytes((p.ACK,))
    assert server.leases[mac_of(1)][0] == ip_of(1)


@pytest.mark.parametrize("proxy", [False, True])
def test_ipxe_is_told_not_to_wait_for_proxy_offers_unless_we_are_the_proxy(
        state_dir, client_sock, proxy):
    """iPXE waits 2 s after a DHCP offer for ProxyDHCP offers unless told not to (its
    encapsulated option 175.176, no-pxedhcp): our full offer carries the boot file already.
    As the ProxyDHCP ourselves, another server gives the address: its offer must not stop
    iPXE from waiting for ours. Other clients are not iPXE and get no option 175."""
    (state_dir / "provisiond.yaml").write_text(f"dhcp:\n  proxy: {str(proxy).lower()}\n")
    config = load_config(state_dir)
    add_nodes(config, 1)
    server = start(config, client_sock)
    try:
        _, _, bootfile, ipxe = exchange(server, client_sock, relayed(
            mac_of(1), p.DISCOVER, (p.OPT_USER_CLASS, b"iPXE"),
            (p.OPT_VENDOR_CLASS, b"PXEClient:Arch:00000")))
        _, _, _, bios = exchange(server, client_sock, relayed(
            mac_of(1), p.DISCOVER, (p.OPT_VENDOR_CLASS, b"PXEClient:Arch:00000")))
    finally:
        server.close()
    assert bootfile.endswith(b"/boot/ipxe")
    assert ipxe.get(p.OPT_IPXE) == (None if proxy else b"\xb0\x01\x01")
    assert p.OPT_IPXE not in bios


def test_wrong_address_gets_nak_and_other_server_is_ignored(server, client_sock):
    wrong = relayed(mac_of(2), p.REQUEST, (p.OPT_REQUESTED_IP, socket.inet_aton("10.1.1.1")))
    assert exchange(server, client_sock, wrong)[3][p.OPT_MSG_TYPE] == bytes((p.NAK,))
    other = relayed(mac_of(2), p.REQUEST, (p.OPT_SERVER_ID, socket.inet_aton("10.9.9.9")))
    client_sock.sendto(other, server.sock.getsockname())
    with pytest.raises(TimeoutError):
        client_sock.recvfrom(2048)


def test_proxy_mode_gives_boot_information_only(state_dir, client_sock):
    (state_dir / "provisiond.yaml").write_text("dhcp:\n  proxy: true\n")
    config = load_config(state_dir)
    add_nodes(config, 1)
    server = start(config, client_sock)
    try:
        yiaddr, _, bootfile, opts = exchange(server, client_sock, relayed(
            mac_of(1), p.DISCOVER, (p.OPT_VENDOR_CLASS, b"PXEClient:Arch:00000")))
    finally:
        server.close()
    assert yiaddr == "0.0.0.0" and bootfile == b"undionly.kpxe"
    assert opts[p.OPT_VENDOR_CLASS] == b"PXEClient" and p.OPT_SUBNET not in opts


def test_proxy_port_answers_the_requesting_socket(state_dir, client_sock):
    (state_dir / "provisiond.yaml").write_text("dhcp:\n  proxy: true\n")
    config = load_config(state_dir)
    add_nodes(config, 1)
    server = start(config, client_sock)
    server.answer_peer = True
    server.client_port = server.relay_port = 9  # were the reply routed by address, it would miss
    try:
        request = bytearray(p.encode_request(mac_of(1), p.REQUEST, options=[
            (p.OPT_ARCH, b"\0\7"), (p.OPT_VENDOR_CLASS, b"PXEClient:Arch:00007")]))
        request[12:16] = socket.inet_aton("127.0.0.1")  # ciaddr: the client has its address
        _, _, bootfile, opts = exchange(server, client_sock, bytes(request))
    finally:
        server.close()
    assert opts[p.OPT_MSG_TYPE] == bytes((p.ACK,)) and bootfile == b"snponly.efi"
    # The address came from the other DHCP server: nothing was leased here, and the two
    # proxy sockets (67, 4011) must not overwrite one lease file with each other's dicts.
    assert server.leases == {}


def test_random_junk_never_stops_the_server(server, client_sock):
    rng = random.Random(1234)
    target = server.sock.getsockname()
    valid = relayed(mac_of(3), p.DISCOVER)
    # Address fields (ciaddr..giaddr, bytes 12-27) stay intact: replies go only to loopback.
    spots = [i for i in range(len(valid)) if not 12 <= i < 28]
    for i in range(2000):
        if i % 2:
            junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 600)))
        else:  # a valid header with corrupted bytes: reaches the option walk
            junk = bytearray(valid)
            for _ in range(rng.randint(1, 8)):
                junk[rng.choice(spots)] = rng.getrandbits(8)
            junk = bytes(junk[:rng.randint(200, len(junk))])
        client_sock.sendto(junk, target)
    client_sock.settimeout(0.2)
    try:
        while True:
            client_sock.recvfrom(2048)  # drain answers some corrupted copies may get
    except TimeoutError:
        pass
    client_sock.settimeout(2)
    assert exchange(server, client_sock, relayed(mac_of(3), p.DISCOVER))[0] == ip_of(3)


class SentTo:
    """Records what the server sends, and where (the destination decides who hears it)."""

    def __init__(self):
        self.sent: list[tuple[bytes, tuple]] = []

    def sendto(self, data: bytes, address: tuple) -> None:
        self.sent.append((data, address))


def nak_for(server, ciaddr: str, giaddr: str = "0.0.0.0") -> tuple[bytes, tuple]:
    """Hand a request for a wrong address straight to `handle`; the NAK and its destination."""
    request = bytearray(p.encode_request(mac_of(2), p.REQUEST))
    request[10:12] = b"\0\0"  # broadcast flag clear, as a renewing client sends it
    request[12:16], request[24:28] = socket.inet_aton(ciaddr), socket.inet_aton(giaddr)
    server.sock, real = SentTo(), server.sock
    try:
        server.handle(bytes(request), ("127.0.0.1", 68))
        (reply,) = server.sock.sent
    finally:
        server.sock = real
    assert p.decode_reply(reply[0])[3][p.OPT_MSG_TYPE] == bytes((p.NAK,))
    return reply


def test_nak_is_broadcast_with_ciaddr_zero(config):
    """RFC 2131 4.1: a NAK is broadcast when giaddr is zero, even to a client with a ciaddr
    (its address is wrong, maybe not even on this network); Table 3: ciaddr 0."""
    add_nodes(config, 3)
    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    try:
        data, address = nak_for(server, ciaddr="10.1.1.1")
    finally:
        server.close()
    assert address == ("255.255.255.255", 68)
    assert data[12:16] == bytes(4)


def test_nak_through_a_relay_sets_the_broadcast_flag(config):
    """RFC 2131 4.3.2: through a relay the NAK carries the broadcast bit, so the relay
    broadcasts it to the client."""
    add_nodes(config, 3)
    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    try:
        data, address = nak_for(server, ciaddr="10.1.1.1", giaddr="127.0.0.1")
    finally:
        server.close()
    assert address == ("127.0.0.1", 67)
    assert data[10] & 0x80 and data[12:16] == bytes(4)


def test_close_waits_for_the_loop_before_the_last_lease_save(config):
    """close() returns once the loop has ended, so its final lease save never races a
    packet being handled (a dict changing size while it is written)."""
    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    thread = server.start()
    server.close()
    assert not thread.is_alive()


def test_saved_leases_leave_out_expired_ones(server):
    import json
    import time

    server.leases = {mac_of(1): (ip_of(1), time.time() + 600), mac_of(2): (ip_of(2), 1.0)}
    server.save_leases()
    saved = json.loads((server.config.state_dir / "dhcp-leases.json").read_text())
    assert set(saved) == {mac_of(1)} and set(server.leases) == {mac_of(1)}


def test_a_lease_write_that_fails_is_written_later(config):
    """save_leases marked the leases clean before writing: one failed write (a full disk,
    here a directory in the way) meant the leases were never written, not at the next
    tick, not on close."""
    import json

    server = DhcpServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    target = config.state_dir / "dhcp-leases.json"
    try:
        server._lease(mac_of(1), ip_of(1))
        target.mkdir()
        with pytest.raises(OSError):
            server.save_leases()
        target.rmdir()
    finally:
        server.close()  # the final save
    assert json.loads(target.read_text())[mac_of(1)]["ip"] == ip_of(1)


def test_requests_replies_and_junk_are_counted(config, client_sock, live_metrics):
    """Counted per packet in the loop, published to the metrics when it ticks or closes."""
    add_nodes(config, 2)
    server = start(config, client_sock)
    try:
        exchange(server, client_sock, relayed(mac_of(1), p.DISCOVER))
        exchange(server, client_sock, relayed(mac_of(1), p.REQUEST, (p.OPT_REQUESTED_IP,
                                                                     socket.inet_aton(ip_of(1)))))
        exchange(server, client_sock, relayed(mac_of(2), p.REQUEST, (p.OPT_REQUESTED_IP,
                                                                     socket.inet_aton("10.1.1.1"))))
        for packet in (relayed(mac_of(9), p.DISCOVER), relayed(mac_of(2), p.REQUEST, (
                p.OPT_SERVER_ID, socket.inet_aton("10.9.9.9"))), b"junk"):
            client_sock.sendto(packet, server.sock.getsockname())
        wait_until(lambda: server.errors == 1, 10, "the junk taken (it was sent last)")
    finally:
        server.close()
    seen = live_metrics()
    assert by_label(seen, "provisiond_dhcp_requests_total", "type") == {"discover": 2,
                                                                         "request": 3}
    assert by_label(seen, "provisiond_dhcp_replies_total", "type") == {"offer": 1, "ack": 1,
                                                                        "nak": 1}
    assert by_label(seen, "provisiond_dhcp_ignored_total", "reason") == {
        "unknown_client": 1, "other_server": 1}
    assert by_label(seen, "provisiond_dhcp_errors_total", "kind") == {"malformed": 1}


def test_counts_are_published_each_tick_while_serving(config, client_sock, live_metrics):
    add_nodes(config, 1)
    server = start(config, client_sock)
    try:
        exchange(server, client_sock, relayed(mac_of(1), p.DISCOVER))
        wait_until(lambda: by_label(live_metrics(), "provisiond_dhcp_replies_total", "type"),
                   server.tick_seconds * 5, "the offer counted before close()")
    finally:
        server.close()
