"""The TFTP server under a flood of read requests that never ACK: it holds a bounded number
of sessions (each is a socket) and keeps serving, in a process with few file descriptors."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time

import pytest

from servers import REPO, free_port

IPXE_ROOT = "/usr/lib/ipxe"
SERVER = """
import sys
from provisiond.boot.tftp import TftpServer
server = TftpServer(sys.argv[1])
server.max_sessions = int(sys.argv[3])
server.listen("127.0.0.1", int(sys.argv[2]), timeout=0.5, retries=2)
"""


def few_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


@pytest.mark.parametrize("max_sessions", [16, 1000])  # the cap; then running out of fds
def test_unacked_flood_neither_exhausts_fds_nor_stops_the_server(tmp_path, max_sessions):
    port = free_port(socket.SOCK_DGRAM)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-c", SERVER, IPXE_ROOT, str(port), str(max_sessions)]
    proc = subprocess.Popen(command, env=env, preexec_fn=few_fds, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood:
            for _ in range(100):  # 100 sessions would need 100 sockets: more than 64 fds
                flood.sendto(b"\0\1undionly.kpxe\0octet\0", ("127.0.0.1", port))
                time.sleep(0.002)
        time.sleep(2.5)  # the flood's sessions time out (0.5 s x 2 tries)
        out = tmp_path / "undionly.kpxe"
        fetched = subprocess.run(["curl", "-sS", "--max-time", "10", "-o", str(out),
                                  f"tftp://127.0.0.1:{port}/undionly.kpxe"], capture_output=True)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert fetched.returncode == 0, fetched.stderr
        assert out.read_bytes() == open(f"{IPXE_ROOT}/undionly.kpxe", "rb").read()
    finally:
        proc.kill()
        proc.wait()
