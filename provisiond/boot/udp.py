"""A single-threaded UDP loop shared by the DHCP and DNS servers: no thread per packet.

A bad packet is counted and dropped; the loop itself never dies of one.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

log = logging.getLogger("provisiond.boot")
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)


def open_udp(bind: str, port: int, interface: str | None = None,
             broadcast: bool = False) -> socket.socket:
    """A bound UDP socket; SO_BINDTODEVICE pins it to `interface` when one is given.

    Broadcast (DHCP) sockets set SO_REUSEADDR; others do not, so a port in use is an error.
    """
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if broadcast:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    if interface:
        sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, interface.encode())
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((bind, port))
    return sock


class UdpServer:
    """Receive, `handle`, reply; `tick` runs about every `tick_seconds` for housekeeping."""

    name = "udp"
    tick_seconds = 1.0

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(self.tick_seconds)
        self.stopping = threading.Event()
        self.errors = 0
        self.address = sock.getsockname()
        self._thread: threading.Thread | None = None

    def handle(self, data: bytes, peer: tuple) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        """Periodic work (persistence, forwarding timeouts); nothing by default."""

    def serve_forever(self) -> None:
        recv, handle, clock = self.sock.recvfrom, self.handle, time.monotonic
        next_tick = clock() + self.tick_seconds
        while not self.stopping.is_set():
            try:
                data, peer = recv(65535)
            except (TimeoutError, socket.timeout):
                next_tick = self._tick()
                continue
            except OSError as exc:
                if self.stopping.is_set() or self.sock.fileno() < 0:
                    break
                self.errors += 1  # e.g. an ICMP error queued on the socket: keep serving
                log.warning("%s: receive failed: %s", self.name, exc)
                continue
            try:
                handle(data, peer)
            except Exception as exc:  # one bad packet must never stop the server
                self.errors += 1
                log.debug("%s: dropped packet from %s: %s", self.name, peer, exc)
            if clock() >= next_tick:  # busy: a receive may never time out
                next_tick = self._tick()

    def _tick(self) -> float:
        """Run tick(); the monotonic time the next one is due."""
        try:
            self.tick()
        except Exception as exc:  # e.g. a full disk for the leases: retried next tick
            self.errors += 1
            log.error("%s: %s: %s", self.name, type(exc).__name__, exc)
        return time.monotonic() + self.tick_seconds

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        """Stop the loop, wait until its last packet is handled, then close the socket."""
        self.stop()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(self.tick_seconds + 1)
        self.sock.close()
