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

import pytest

from provisiond.config import write_default_config
from servers import free_port, start_serve, stop_serve, write_config
from tftp_flood import rrq, wait_until_served

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
        yield port, root
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
    port, _ = served
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
    _, root = served
    if not (root / "loop").is_symlink():
        (root / "loop").symlink_to("loop")
    assert client().request(rrq(name)) == b"\0\5\0\1file not found\0"
