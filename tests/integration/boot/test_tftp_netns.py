"""`provisiond serve --tftp` bound to all addresses (the default), in a namespace whose boot
interface has two addresses: a client asking either one gets its answers (data and errors)
from that one, as from tftpd-hpa (tftp-hpa's client ignores answers from other addresses)."""

from __future__ import annotations

import sys

import pytest

from netns import ip, make_link
from provisiond.config import write_default_config
from servers import start_serve, stop_serve, write_config
from tftp_flood import tftp_get, wait_until_served

pytestmark = pytest.mark.netns
IPXE_ROOT = "/usr/lib/ipxe"
FILE = "undionly.kpxe"
PRIMARY, SECONDARY = "10.99.0.1", "10.99.0.2"


@pytest.fixture
def link():
    link = make_link("tf", f"{PRIMARY}/16")
    try:
        ip("-n", link.server_ns, "addr", "add", f"{SECONDARY}/16", "dev", link.server_if)
        ip("-n", link.client_ns, "addr", "add", "10.99.0.50/16", "dev", link.client_if)
        yield link
    finally:
        link.close()


ANSWER = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(5)
sock.sendto(b"\\0\\1" + sys.argv[2].encode() + b"\\0octet\\0", (sys.argv[1], 69))
packet, (source, _) = sock.recvfrom(2000)
print(source, packet[:4].hex())
"""


def first_answer(link, server: str, name: str) -> tuple[str, bytes]:
    """(source address, first 4 bytes) of the answer to a read request sent to `server`."""
    result = link.client(sys.executable, "-c", ANSWER, server, name, text=True)
    assert result.returncode == 0, result.stderr
    source, head = result.stdout.split()
    return source, bytes.fromhex(head)


def test_a_wildcard_bind_answers_from_the_address_asked(link, tmp_path):
    state = tmp_path / "state"
    write_default_config(state)
    write_config(state, tftp={"enabled": True, "bind": "0.0.0.0", "port": 69})
    proc = start_serve(state, "--no-http", "--tftp", netns=link.server_ns)
    expected = open(f"{IPXE_ROOT}/{FILE}", "rb").read()
    try:
        wait_until_served(69, FILE, expected, tmp_path / "probe", host=PRIMARY,
                          netns=link.client_ns)
        out = tmp_path / "out"
        output = tftp_get(69, FILE, out, host=SECONDARY, netns=link.client_ns)
        assert out.exists() and out.read_bytes() == expected, output
        assert first_answer(link, SECONDARY, "nosuch") == (SECONDARY, b"\0\5\0\1")
        assert first_answer(link, SECONDARY, FILE)[0] == SECONDARY
    finally:
        stop_serve(proc)
