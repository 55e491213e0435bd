"""The TFTP server under a flood of read requests that never ACK: it opens a bounded number
of transfers (each is a socket), drops the rest, and keeps serving, in a process with few
file descriptors. The flood sees what the server did: a transfer opened answers from a new
port; a dropped request gets nothing."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time

import pytest

from servers import REPO, free_port
from tftp_flood import Flood, rrq, wait_until_served

IPXE_ROOT = "/usr/lib/ipxe"
FILE = "undionly.kpxe"
FLOOD = 100
SERVER = """
import logging, sys
from provisiond.boot.tftp import TftpServer
logging.basicConfig(level=logging.INFO)
server = TftpServer(sys.argv[1], max_sessions=int(sys.argv[3]), per_client=int(sys.argv[4]),
                    retries=1, loops=1)  # one loop reads the requests in order: the marker is last
server.bind("127.0.0.1", int(sys.argv[2]))
server.listen()
"""


def few_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def flood_until_marker(port: int) -> Flood:
    """FLOOD requests (1 s timeout), then a write request whose refusal comes back only once
    the server has taken or dropped every request before it (one socket, read in order)."""
    flood = Flood(port, FLOOD).send(rrq(FILE, timeout=1))
    marker = Flood(port, 1).send(b"\0\2marker\0octet\0")
    marker.collect(lambda m: m.answered() == 1)
    assert marker.refusals() == 1, "the server never answered"
    marker.close()
    flood.collect(lambda f: False, timeout=0.5)  # what the server sent before the marker
    return flood


# the cap; then running out of fds, under a per-address limit of 64 that the ~30 transfers
# 64 fds hold never reach, unless the slots of requests dropped for want of fds are kept
@pytest.mark.parametrize("max_sessions, per_client", [(16, 1000), (1000, 64)])
def test_unacked_flood_neither_exhausts_fds_nor_stops_the_server(tmp_path, max_sessions,
                                                                  per_client):
    port = free_port(socket.SOCK_DGRAM)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-c", SERVER, IPXE_ROOT, str(port), str(max_sessions),
               str(per_client)]
    proc = subprocess.Popen(command, env=env, preexec_fn=few_fds, stderr=open(log_path, "wb"))
    expected = open(f"{IPXE_ROOT}/{FILE}", "rb").read()
    try:
        wait_until_served(port, FILE, expected, tmp_path / "probe")
        flood = flood_until_marker(port)
        opened = flood.transfers()
        if max_sessions == 16:
            assert opened == 16
        else:  # 64 fds: the sockets and files it could open, no more
            assert 0 < opened < 64
            assert b"Too many open files" in log_path.read_bytes()
        assert flood.answered() == opened, "a dropped request was answered"
        deadline = time.monotonic() + 30  # 1 s timeout, one resend
        while log_path.read_bytes().count(b" abandoned") < opened:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        flood.close()
        wait_until_served(port, FILE, expected, tmp_path / "out")
        assert proc.poll() is None, log_path.read_text()[-2000:]
        assert b"Traceback" not in log_path.read_bytes()
    finally:
        proc.kill()
        proc.wait()
