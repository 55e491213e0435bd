"""Read-only TFTP for the iPXE binaries, built on tftpy with a leaner server loop.

Refused: writes, names with a `..` part, absolute names. tftpy does blksize and tsize; the
loop here replaces tftpy's (which formats debug strings and scans every session per packet)
with a socket -> session map, so a 1 MB transfer costs about what tftpd-hpa's does.
"""

from __future__ import annotations

import logging
import os
import select
import time

import tftpy
from tftpy.TftpContexts import TftpContextServer
from tftpy.TftpPacketTypes import TftpPacketRRQ
from tftpy.TftpShared import TftpErrors, TftpException, TftpTimeout, TftpTimeoutExpectACK

from provisiond.config import Config

log = logging.getLogger("provisiond.boot")
logging.getLogger("tftpy").setLevel(logging.WARNING)
MAX_SESSIONS = 256  # transfers at once, a socket each; a client over it retries its request


def refusal(filename: str) -> str | None:
    """Why a requested name is refused, or None if it may be looked up under the root."""
    if filename.startswith("/") or filename.startswith("\\"):
        return "absolute paths are refused"
    if any(part == ".." for part in filename.replace("\\", "/").split("/")):
        return "'..' is refused"
    if "\0" in filename or not filename:
        return "bad file name"
    return None


class _Context(TftpContextServer):
    """A session that accepts only read requests for names inside the root."""

    def start(self, buffer: bytes) -> None:
        self.metrics.start_time = self.last_update = time.time()
        self.tidport = self.port
        pkt = self.factory.parse(buffer)
        why = "writes are refused" if not isinstance(pkt, TftpPacketRRQ) else refusal(
            pkt.filename)
        if why:
            self.state.sendError(TftpErrors.AccessViolation)
            raise TftpException(f"{self.host}: {why}: {getattr(pkt, 'filename', '')[:80]!r}")
        if os.path.isdir(os.path.join(self.root, pkt.filename)):
            self.state.sendError(TftpErrors.FileNotFound)
            raise TftpException(f"{self.host}: {pkt.filename[:80]!r} is a directory")
        self.state = self.state.handle(pkt, self.host, self.port)


class TftpServer(tftpy.TftpServer):
    """tftpy's server with a refusing session type and an O(1) packet -> session loop."""

    def __init__(self, root: str, node_for=None):
        super().__init__(root)
        self.node_for = node_for or (lambda address: None)
        self.sessions: dict[object, _Context] = {}
        self.max_sessions = MAX_SESSIONS
        self.dropped = 0

    def bind(self, listenip: str = "0.0.0.0", listenport: int = 69) -> None:
        """Open the server socket (in the caller's thread, so a port in use raises there)."""
        from provisiond.boot.udp import open_udp

        self.sock = open_udp(listenip, listenport)
        self.sock.setblocking(False)
        self.listenport = self.sock.getsockname()[1]

    def listen(self, listenip: str = "0.0.0.0", listenport: int = 69, timeout: float = 5,
               retries: int = 5) -> None:
        if self.sock is None:
            self.bind(listenip, listenport)
        self.is_running.set()
        checked = time.monotonic()
        while not (self.shutdown_immediately or self.shutdown_gracefully and not self.sessions):
            ready, _, _ = select.select([self.sock, *self.sessions], [], [], 0.5)
            for sock in ready:
                if sock is self.sock:
                    self._new_session(timeout, retries)
                elif sock in self.sessions:
                    self._cycle(sock)
            if time.monotonic() - checked > 0.5:
                checked = time.monotonic()
                self._check_timeouts()
        self._close_all()

    def _new_session(self, timeout: float, retries: int) -> None:
        try:
            buffer, (host, port) = self.sock.recvfrom(65536)
        except OSError:
            return
        if self.shutdown_gracefully or not self._room(host):
            return
        try:
            context = _Context(host, port, timeout, self.root, retries=retries)
        except OSError as exc:  # out of file descriptors: this request is dropped
            self._refused(host, exc.strerror or str(exc))
            return
        try:
            context.start(buffer)
        except TftpTimeoutExpectACK:
            context.timeout_expectACK = True
        except Exception as exc:  # a bad first packet ends only its own session
            log.info("tftp: %s:%s refused: %s", host, port, exc)
            context.end()
            return
        self.sessions[context.sock] = context

    def _room(self, host: str) -> bool:
        """True if one more session (one socket) fits under `max_sessions`."""
        if len(self.sessions) < self.max_sessions:
            return True
        self._refused(host, f"{self.max_sessions} transfers already running")
        return False

    def _refused(self, host: str, why: str) -> None:
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:  # 1st, 2nd, 4th... drop
            log.warning("tftp: request from %s dropped (%s); %d so far", host, why, self.dropped)

    def _cycle(self, sock) -> None:
        context = self.sessions[sock]
        context.timeout_expectACK = False
        try:
            context.cycle()
        except TftpTimeoutExpectACK:
            context.timeout_expectACK = True
            return
        except Exception as exc:
            log.info("tftp: %s: transfer failed: %s", context.host, exc)
            self._finish(sock, ok=False)
            return
        if context.state is None:
            self._finish(sock, ok=True)

    def _check_timeouts(self) -> None:
        now = time.time()
        for sock, context in list(self.sessions.items()):
            try:
                context.checkTimeout(now)
            except TftpTimeout:
                context.retry_count += 1
                if context.retry_count >= context.retries:
                    self._finish(sock, ok=False)
                else:
                    context.state.resendLast()

    def _finish(self, sock, ok: bool) -> None:
        context = self.sessions.pop(sock)
        context.end()
        if ok:
            metrics = context.metrics
            node = self.node_for(context.host) or context.host
            log.info("%s tftp %s %d bytes %.1f ms", node, context.file_to_transfer,
                     metrics.bytes, (metrics.end_time - metrics.start_time) * 1000)

    def _close_all(self) -> None:
        for sock in list(self.sessions):
            self.sessions.pop(sock).end()
        self.sock.close()
        self.is_running.clear()
        self.shutdown_gracefully = self.shutdown_immediately = False


def make_tftp_server(config: Config, node_for=None) -> TftpServer:
    return TftpServer(config.tftp.root, node_for)
