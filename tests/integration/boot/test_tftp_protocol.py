"""`provisiond serve --tftp` spoken to packet by packet (RFC 1350, 2347-2349, 7440), as a
hostile or careless client would: bad option values, duplicate and stray ACKs, errors from
the client, files with awkward sizes or that change while they are sent.

Each test sends from its own loopback address, so the per-address limit of one never meets
the transfers another left open. No test waits on time for something not to happen: the
next packet expected is the proof (a resend would come before it)."""

from __future__ import annotations

import itertools
import os
import socket
import time

import pytest

from provisiond.config import write_default_config
from servers import free_port, start_serve, stop_serve, write_config
from tftp_flood import Flood, rrq, wait_until_served

PER_CLIENT = 2
SMALL = os.urandom(100)
ADDRESSES = itertools.count(1)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(port, root) of a serve whose root the tests add files to."""
    base = tmp_path_factory.mktemp("tftpproto")
    root = base / "root"
    root.mkdir()
    (root / "small.bin").write_bytes(SMALL)
    (root / "empty.bin").write_bytes(b"")
    (root / "exact.bin").write_bytes(os.urandom(1024))  # two blocks of 512, then an empty one
    state = base / "state"
    write_default_config(state)
    port = free_port(socket.SOCK_DGRAM)
    write_config(state, tftp={"enabled": True, "bind": "127.0.0.1", "port": port,
                              "root": str(root), "sessions_per_client": PER_CLIENT})
    proc = start_serve(state, "--no-http", "--tftp")
    try:
        wait_until_served(port, "small.bin", SMALL, base / "probe")
        yield port, root, state / "serve.log"
    finally:
        stop_serve(proc)


class Client:
    """One client port: a request to the server, then packets to and from its transfer."""

    def __init__(self, port: int, source: str):
        self.port, self.tid = port, None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((source, 0))
        self.sock.settimeout(10)  # the bound on every wait; none is expected to take it

    def request(self, packet: bytes) -> bytes:
        """Send a request; its first answer (the transfer's port is kept)."""
        self.sock.sendto(packet, ("127.0.0.1", self.port))
        answer, (_, self.tid) = self.sock.recvfrom(70000)
        return answer

    def send(self, packet: bytes) -> None:
        self.sock.sendto(packet, ("127.0.0.1", self.tid))

    def receive(self) -> bytes:
        packet, (_, port) = self.sock.recvfrom(70000)
        assert port == self.tid, "a packet from another port than the transfer's"
        return packet

    def ack(self, block: int) -> None:
        self.send(b"\0\4" + block.to_bytes(2, "big"))

    def close(self) -> None:
        if self.tid:
            self.send(b"\0\5\0\0done\0")  # ends a transfer still open, frees its slot
        self.sock.close()


@pytest.fixture
def client(served):
    """Makes Clients, each at a loopback address no other Client had."""
    port, _, _ = served
    clients = []

    def make() -> Client:
        clients.append(Client(port, f"127.0.1.{next(ADDRESSES)}"))
        return clients[-1]

    yield make
    for made in clients:
        made.close()


def data(block: int, payload: bytes) -> bytes:
    return b"\0\3" + block.to_bytes(2, "big") + payload


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "\u0661\u0664\u0666\u0668"])
def test_an_option_value_that_is_not_a_number_is_ignored(client, value):
    """'²' and Arabic-Indic digits pass str.isdigit, 5000 digits exceed int()'s limit: the
    option is ignored and the file sent with the default block size."""
    first = client()
    packet = b"\0\1small.bin\0octet\0blksize\0" + value.encode() + b"\0"
    assert first.request(packet) == data(1, SMALL)
    first.ack(1)


@pytest.mark.parametrize("name", ["small.bin/x", "a" * 300, "loop", "\u00e9t\u00e9/\u2603"])
def test_a_name_that_cannot_be_opened_is_not_found(served, client, name):
    """ENOTDIR, ENAMETOOLONG, ELOOP were dropped unanswered, the client left to retry."""
    _, root, _ = served
    if not (root / "loop").is_symlink():
        (root / "loop").symlink_to("loop")
    assert client().request(rrq(name)) == b"\0\5\0\1file not found\0"


def test_a_file_cut_short_while_sent_ends_with_an_error(served, client):
    """Not a short block the client would take for the end of a whole file."""
    _, root, _ = served
    content = os.urandom(20)
    (root / "shrink.bin").write_bytes(content)
    first = client()
    assert first.request(rrq("shrink.bin", blksize=8)) == b"\0\6blksize\x008\0"
    first.ack(0)
    assert first.receive() == data(1, content[:8])
    os.truncate(root / "shrink.bin", 4)
    first.ack(1)
    assert first.receive() == b"\0\5\0\0file changed during the transfer\0"


def test_a_file_grown_while_sent_is_sent_at_the_size_announced(served, client):
    """tsize said 20 bytes: the third block of 8 is the last, 4 bytes, whatever was added."""
    _, root, _ = served
    content = os.urandom(20)
    (root / "grow.bin").write_bytes(content)
    first = client()
    assert first.request(rrq("grow.bin", blksize=8, tsize=0)) == b"\0\6blksize\x008\0tsize\x0020\0"
    first.ack(0)
    assert first.receive() == data(1, content[:8])
    with open(root / "grow.bin", "ab") as grown:
        grown.write(os.urandom(100))
    first.ack(1)
    assert first.receive() == data(2, content[8:16])
    first.ack(2)
    assert first.receive() == data(3, content[16:])
    first.ack(3)


def test_a_duplicate_ack_sends_nothing_again(client, served):
    """Sorcerer's Apprentice (RFC 1350 errata, RFC 1123 4.2.3.1): the duplicate ACK 1 must
    not send block 2 again, so the packet after ACK 2 is block 3 (the timeout asked for,
    255 s, keeps the server's own resend out of the way)."""
    _, root, _ = served
    content = (root / "exact.bin").read_bytes()
    first = client()
    assert first.request(rrq("exact.bin", timeout=255)) == b"\0\6timeout\x00255\0"
    first.ack(0)
    assert first.receive() == data(1, content[:512])
    first.ack(1)
    assert first.receive() == data(2, content[512:])
    first.ack(1)
    first.ack(0)
    first.ack(7)  # a block not sent yet: ignored too
    first.ack(2)
    assert first.receive() == data(3, b"")  # 1024 bytes: an empty block says it ended
    first.ack(3)


@pytest.mark.parametrize("name, options, first", [
    ("empty.bin", {}, data(1, b"")),
    ("empty.bin", {"tsize": 0}, b"\0\6tsize\x000\0"),
    ("small.bin", {"blksize": 7, "windowsize": 0, "timeout": 0}, data(1, SMALL)),
    ("small.bin", {"timeout": 256, "multicast": 1}, data(1, SMALL)),
    ("small.bin", {"blksize": 65465, "tsize": 5, "timeout": 255},
     b"\0\6blksize\x0065464\0timeout\x00255\0tsize\x00100\0"),
])
def test_option_values_out_of_range_are_ignored_or_lowered(client, name, options, first):
    """RFC 2348: blksize 8-65464 (a larger one may be lowered); RFC 2349: timeout 1-255,
    tsize answered with the size; RFC 7440: windowsize at least 1; unknown options
    ignored; no option left, no OACK."""
    asker = client()
    assert asker.request(rrq(name, **options)) == first
    if first[:2] == b"\0\3":
        asker.ack(1)


def test_a_window_resumes_after_the_last_block_acknowledged(client, served):
    """RFC 7440: an ACK inside the window (block 3 lost, say) sends from the block after it."""
    blocks = [SMALL[n:n + 8] for n in range(0, 100, 8)]
    first = client()
    assert first.request(rrq("small.bin", blksize=8, windowsize=4, timeout=255)) == (
        b"\0\6blksize\x008\0windowsize\x004\0timeout\x00255\0")
    first.ack(0)
    assert [first.receive() for _ in range(4)] == [data(n, blocks[n - 1]) for n in (1, 2, 3, 4)]
    first.ack(2)
    assert [first.receive() for _ in range(4)] == [data(n, blocks[n - 1]) for n in (3, 4, 5, 6)]


def test_packets_from_another_port_leave_the_transfer_alone(client, served):
    """The transfer's socket is connected to its client: another port's ERROR or ACK does
    not reach it (the kernel answers with ICMP port unreachable, tftpd-hpa with nothing)."""
    first, stray = client(), client()
    first.request(rrq("exact.bin", timeout=255))
    stray.tid = first.tid
    stray.send(b"\0\5\0\0go away\0")
    stray.ack(0)
    stray.tid = None
    first.ack(0)
    assert first.receive()[:4] == b"\0\3\0\1"


def test_a_write_request_is_refused(client):
    assert client().request(b"\0\2new.bin\0octet\0") == b"\0\5\0\2writes are refused\0"


def test_an_error_from_the_client_ends_its_transfer_and_frees_its_slot(client, served):
    """PER_CLIENT transfers from one address; one ends with the client's ERROR: a request
    from that address is then served (the ERROR and the request reach different sockets,
    so the request is retried, within a bound, until the slot is seen free)."""
    port, _, _ = served
    host = f"127.0.1.{next(ADDRESSES)}"
    holders = [Client(port, host) for _ in range(PER_CLIENT)]
    try:
        for holder in holders:
            assert holder.request(rrq("small.bin", timeout=255))[:2] == b"\0\6"
        late = Client(port, host)
        assert late.request(rrq("small.bin"))[:4] == b"\0\5\0\0"  # too many from it
        holders[0].send(b"\0\5\0\0cancelled\0")
        holders[0].tid = None
        deadline = time.monotonic() + 10
        while (answer := late.request(rrq("small.bin")))[:2] == b"\0\5":
            assert time.monotonic() < deadline, answer
        assert answer == data(1, SMALL)
        late.ack(1)
        late.tid = None
        late.close()
    finally:
        for holder in holders:
            holder.close()


def test_a_flood_of_bad_requests_is_not_logged_line_for_line(served, client):
    """1,000 requests for a missing file, in bursts of 100 from ports of their own (each burst
    answered before the next, so none is lost in a socket buffer): a few lines a second are
    logged, then one saying how many were held back (it comes with the next line logged,
    hence the probes)."""
    port, _, log_path = served
    source = f"127.0.1.{next(ADDRESSES)}"
    for _ in range(10):
        flood = Flood(port, 100, source).send(rrq("flood-missing"))
        flood.collect(lambda f: f.answered() == 100)
        flood.close()
        assert flood.refusals(b"file not found") == 100
    probe = client()
    deadline = time.monotonic() + 30
    while b"not logged before it" not in log_path.read_bytes():
        assert time.monotonic() < deadline, log_path.read_text()[-2000:]
        probe.request(rrq("flood-probe"))
        time.sleep(0.2)  # the next second's first refusal carries the count
    logged = log_path.read_bytes().count(b"flood-")
    assert 0 < logged < 200, f"{logged} lines for 1000 refused requests"
