"""Hostile TFTP clients for the tests: read requests that are never acknowledged, each from
its own socket (its own port, so each may open a transfer), and what came back to them."""

from __future__ import annotations

import select
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TFTP = "/usr/bin/tftp"  # tftp-hpa's client
ATFTP = "/usr/bin/atftp"


def rrq(name: str, **options: int) -> bytes:
    return (b"\0\1" + name.encode() + b"\0octet\0"
            + b"".join(b"%s\0%d\0" % (key.encode(), value) for key, value in options.items()))


@dataclass
class Flood:
    """`count` sockets bound to `source`, each sending one read request to `port`."""

    port: int
    count: int
    source: str = "127.0.0.1"
    socks: list[socket.socket] = field(default_factory=list)
    answers: dict[int, list[tuple[bytes, int]]] = field(default_factory=dict)  # by socket

    def send(self, packet: bytes, count: int | None = None) -> "Flood":
        """Send `packet` from `count` new sockets (the flood's count if not given)."""
        for _ in range(self.count if count is None else count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((self.source, 0))
            sock.setblocking(False)
            sock.sendto(packet, ("127.0.0.1", self.port))
            self.socks.append(sock)
        return self

    def hold(self, packet: bytes, timeout: float = 20) -> "Flood":
        """Open `count` transfers with `packet` (a read request the server takes), asking
        again from a new socket for each request refused, until `count` are open (bounded).

        A request from an address at its limit is refused while a transfer whose client is
        done still counts: until the server has read the client's last ACK, which another
        of its loops may read after a request sent later (a real client that just finished)."""
        deadline = time.monotonic() + timeout
        self.send(packet)
        while True:
            self.collect(lambda f: f.answered() == len(f.socks), deadline - time.monotonic())
            missing = self.count - self.transfers()
            if missing <= 0:
                return self
            assert time.monotonic() < deadline, (
                f"{self.transfers()} of {self.count} transfers opened from {self.source} in "
                f"{timeout} s; {len(self.socks) - self.answered()} requests unanswered, "
                f"{self.refusals()} refused")
            self.collect(lambda f: False, timeout=0.1)  # a pace between asks, not a wait
            self.send(packet, missing)

    def collect(self, until, timeout: float = 20) -> None:
        """Read answers until `until(self)` holds or `timeout` s have passed."""
        deadline = time.monotonic() + timeout
        while not until(self) and time.monotonic() < deadline:
            ready, _, _ = select.select(self.socks, [], [], 0.2)
            for sock in ready:
                packet, peer = sock.recvfrom(70000)
                self.answers.setdefault(sock.fileno(), []).append((packet, peer[1]))

    def transfers(self) -> int:
        """Sockets answered with DATA or OACK from a new port: a transfer was opened."""
        return sum(any(p[:2] in (b"\0\3", b"\0\6") and port != self.port for p, port in got)
                   for got in self.answers.values())

    def refusals(self, text: bytes = b"") -> int:
        """Sockets answered with a TFTP error (containing `text`) and nothing else."""
        return sum(all(p[:2] == b"\0\5" and text in p for p, _ in got)
                   for got in self.answers.values())

    def answered(self) -> int:
        return len(self.answers)

    def end(self) -> None:
        """Give up the open transfers (an ERROR to each one's port): the server ends them."""
        for sock in self.socks:
            for _, port in self.answers.get(sock.fileno(), []):
                if port != self.port:
                    sock.sendto(b"\0\5\0\0gone\0", ("127.0.0.1", port))

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def tftp_get(port: int, name: str, out: Path, timeout: float = 30, host: str = "127.0.0.1",
             netns: str | None = None) -> str:
    """Fetch `name` with tftp-hpa's client (resending each second, giving up after 10 s),
    from network namespace `netns` if given; its output, since it exits 0 even when the
    server answers with an error."""
    commands = f"binary\nrexmt 1\ntimeout 10\nget {name} {out}\nquit\n"
    command = [TFTP, host, str(port)]
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    result = subprocess.run(command, input=commands, capture_output=True, text=True,
                            timeout=timeout)
    return result.stdout + result.stderr


def wait_until_served(port: int, name: str, expected: bytes, out: Path,
                      timeout: float = 30, **where) -> None:
    """Wait (bounded) until a real client gets `name` byte-identical: the server listens.
    `where`: tftp_get's host and netns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out.unlink(missing_ok=True)
        tftp_get(port, name, out, **where)
        if out.exists() and out.read_bytes() == expected:
            return
        time.sleep(0.2)
    raise TimeoutError(f"no TFTP server answered on port {port} within {timeout} s")


def wait_logged(log_path: Path, text: bytes, count: int, timeout: float = 30) -> None:
    """Wait (bounded) until the server's log holds `text` `count` times (it is flushed once a
    second; a transfer's line is written once its slot is free)."""
    deadline = time.monotonic() + timeout
    while log_path.read_bytes().count(text) < count:
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.2)
