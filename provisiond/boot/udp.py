"""A single-threaded UDP loop shared by the DHCP and DNS servers: no thread per packet.

A bad packet is counted and dropped; the loop itself never dies of one. Servers count what
they do per packet in a plain dict (`counts`), published to provisiond.metrics each tick.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter

from provisiond.boot.table import traceback_if_bug
from provisiond.metrics import add_counts

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
    protocol = "udp"  # its metrics: provisiond_<protocol>_errors_total and the like
    tick_seconds = 1.0

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(self.tick_seconds)
        self.stopping = threading.Event()
        self.errors = 0
        self.counts: Counter[tuple[str, str]] = Counter()  # (counter, label): n, unpublished
        self.address = sock.getsockname()
        self._thread: threading.Thread | None = None
        self._bugs_seen: set[type] = set()
        self._tick_failures = 0

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
                self._count_error("receive")  # e.g. a queued ICMP error: keep serving
                log.warning("%s: receive failed: %s", self.name, exc)
                continue
            try:
                handle(data, peer)
            except Exception as exc:  # one bad packet must never stop the server
                self._dropped(peer, exc)
            if clock() >= next_tick:  # busy: a receive may never time out
                next_tick = self._tick()

    def _dropped(self, peer: tuple, exc: Exception) -> None:
        """A malformed packet is a debug line; any other error is a bug: its traceback is
        logged once per exception type (a client repeating the packet cannot flood the log)."""
        bug = traceback_if_bug(exc)
        self._count_error("malformed" if bug is None else "bug")
        if bug is None or type(exc) in self._bugs_seen:
            log.debug("%s: dropped packet from %s: %s", self.name, peer, exc)
            return
        self._bugs_seen.add(type(exc))
        log.error("%s: dropped packet from %s: %s: %s (logged once)", self.name, peer,
                  type(exc).__name__, exc, exc_info=bug)

    def _tick(self) -> float:
        """Run tick(); the monotonic time the next one is due. A failure (e.g. a full disk
        for the leases) is retried every tick and logged when it starts and when it ends."""
        try:
            self.tick()
        except Exception as exc:
            self._count_error("housekeeping")
            self._tick_failures += 1
            if self._tick_failures == 1:
                log.error("%s: housekeeping failed, retrying every %ss: %s: %s", self.name,
                          self.tick_seconds, type(exc).__name__, exc,
                          exc_info=traceback_if_bug(exc))
        else:
            if self._tick_failures:
                log.info("%s: housekeeping works again (%d failed attempts)", self.name,
                         self._tick_failures)
            self._tick_failures = 0
        self.publish()
        return time.monotonic() + self.tick_seconds

    def _count_error(self, kind: str) -> None:
        self.errors += 1
        self.counts[f"{self.protocol}_errors", kind] += 1

    def publish(self) -> None:
        """Hand the counts so far to provisiond.metrics (in the loop's thread, or after it)."""
        counts, self.counts = self.counts, Counter()
        if counts:
            add_counts(counts)

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
        self.publish()
