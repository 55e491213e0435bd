"""Read-only TFTP (RFC 1350) for the iPXE binaries: epoll loops, one UDP socket per transfer.

Options: blksize (RFC 2348), tsize and timeout (RFC 2349), windowsize (RFC 7440). Refused:
writes, absolute names, `..` parts, names that resolve (symlinks included) outside the root,
anything but a regular file. Bounded: transfers at once, transfers per client address,
retransmissions to a silent client (then the transfer is dropped and logged once), and log
lines about refused or dropped requests (LOG_LINES a second).
Blocks are read with os.pread, so the page cache does the caching and no file is held in
memory; a file is sent at the size it had when its transfer began, and one cut short
meanwhile ends the transfer with an error. netascii is served as octet, as tftpy did.
Requests, transfers and their outcomes are counted (provisiond.metrics).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import sys
import threading
import time
from collections import Counter

from provisiond.boot.tftp_request import (ACCESS_VIOLATION, ACK, DATA, ERROR, HEADER, ILLEGAL,
                                          NOT_DEFINED, NOT_FOUND, Refused, error_packet,
                                          negotiate, open_under, parse_request)
from provisiond.boot.udp import open_udp
from provisiond.config import Config
from provisiond.errors import Conflict
from provisiond.metrics import count

log = logging.getLogger("provisiond.boot")

MAX_SESSIONS = 256  # transfers at once, a socket each; a client over it retries its request
PER_CLIENT = 8  # transfers at once from one address (tftp.sessions_per_client)
TIMEOUT = 1.0  # seconds before a block is sent again, unless the client asks otherwise
RETRIES = 5  # resends without an ACK before a transfer is dropped
TICK = 0.1  # how often timeouts are checked
LOG_LINES = 20  # a second, about refused and dropped requests: a flood of them logs no more
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux's value; Python 3.11 does not name it
REFUSALS = {NOT_DEFINED: "refused_busy", NOT_FOUND: "refused_not_found",
            ACCESS_VIOLATION: "refused_denied", ILLEGAL: "refused_illegal"}  # metric labels


class FileChanged(Conflict):
    """The file being sent was cut short: its transfer ends with an error."""


class LogLimit:
    """At most `per_second` lines a second (shared by the loops); the next line let through
    says how many were held back, so a flood of bad requests cannot fill the disk."""

    def __init__(self, per_second: int = LOG_LINES, clock=time.monotonic):
        self.per_second, self.clock = per_second, clock
        self.second = self.lines = self.held = 0
        self._lock = threading.Lock()

    def log(self, level: int, message: str, *args) -> None:
        with self._lock:
            second = int(self.clock())
            if second != self.second:
                self.second, self.lines = second, 0
            if self.lines >= self.per_second:
                self.held += 1
                return
            self.lines += 1
            held, self.held = self.held, 0
        if held:
            message, args = message + " (%d more not logged before it)", (*args, held)
        log.log(level, message, *args)


def ask_destination(sock: socket.socket) -> None:
    """Have the kernel tell each request's destination address (see `destination`), also
    when bound to one address: one code path, and the answer's source is then that one."""
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    else:
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)


def destination(ancdata: list) -> tuple | None:
    """The address a request was sent to, from its IP_PKTINFO/IPV6_PKTINFO, to bind the
    transfer's socket to: a server bound to all addresses then answers from the one asked
    (as tftpd-hpa does), not from whichever the routing table picks."""
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == IP_PKTINFO:  # ifindex, spec_dst, addr
            return socket.inet_ntop(socket.AF_INET, data[8:12]), 0
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO:  # addr, ifindex
            return (socket.inet_ntop(socket.AF_INET6, data[:16]), 0, 0,
                    int.from_bytes(data[16:20], sys.byteorder))
    return None


class Session:
    """One transfer: its socket (connected to the client), file, options and progress.

    Blocks are numbered from 1 without wrapping (`acked` is -1 while an OACK is unanswered);
    the packets carry the number modulo 65536, so files of any size go through (rollover 0).
    """

    __slots__ = ("sock", "peer", "name", "fd", "size", "blksize", "window", "timeout",
                 "last", "acked", "sent", "oack", "deadline", "tries", "started")

    def __init__(self, sock, peer, name: str, fd: int, options: dict[str, str]):
        self.sock, self.peer, self.name, self.fd = sock, peer, name, fd
        self.size = os.fstat(fd).st_size
        taken = negotiate(options, self.size)
        self.blksize = taken.get("blksize", 512)
        self.window = taken.get("windowsize", 1)
        self.timeout = float(taken.get("timeout", TIMEOUT))
        self.last = self.size // self.blksize + 1  # the last block is shorter than blksize
        self.oack = b"\0\6" + b"".join(b"%s\0%d\0" % (key.encode(), value)
                                       for key, value in taken.items()) if taken else b""
        self.acked = -1 if taken else 0  # -1: the OACK is "block 0", acknowledged by ACK 0
        self.sent = 0
        self.tries = 0
        self.started = self.deadline = time.monotonic()

    def send_window(self, now: float) -> None:
        """Send (again) every block after the last acknowledged one, up to the window."""
        if self.acked < 0:
            self.sock.send(self.oack)
        else:
            send = self.sock.send
            end = min(self.acked + self.window, self.last)
            for block in range(self.acked + 1, end + 1):
                try:
                    send(HEADER.pack(DATA, block & 0xFFFF) + self.read(block))
                except BlockingIOError:  # send buffer full: the rest go after an ACK or timeout
                    end = block - 1
                    break
            self.sent = max(end, self.sent)
        self.deadline = now + self.timeout

    def read(self, block: int) -> bytes:
        """Block `block` of the file at the size it had when the transfer began (the size
        tsize announced); FileChanged if the file is shorter now."""
        offset = (block - 1) * self.blksize
        want = min(self.blksize, self.size - offset)
        payload = os.pread(self.fd, want, offset)
        if len(payload) < want:  # a short block would tell the client the file ends here
            raise FileChanged("file changed during the transfer")
        return payload

    def on_ack(self, number: int) -> bool:
        """Take an ACK (16-bit block number); True if it acknowledged something new.

        Duplicate and stale ACKs change nothing (no Sorcerer's Apprentice resends)."""
        ahead = (number - self.acked) & 0xFFFF
        if ahead == 0 or ahead > max(self.sent, 0) - self.acked:
            return False
        self.acked += ahead
        self.tries = 0
        return True

    @property
    def done(self) -> bool:
        return self.acked == self.last

    def close(self) -> None:
        self.sock.close()
        os.close(self.fd)


class TftpServer:
    """The TFTP server: `bind`, then `listen` (in a thread) until `stop`.

    `listen` runs one TransferLoop per core (the extra ones in threads of their own): the
    kernel's share of each packet, most of its cost, then runs on every core, as tftpd-hpa's
    processes do. The loops share the listening socket and, under a lock, the limits.
    """

    def __init__(self, root: str, node_for=None, per_client: int = PER_CLIENT,
                 max_sessions: int = MAX_SESSIONS, retries: int = RETRIES, loops: int = 0):
        self.root = root
        self.node_for = node_for or (lambda address: None)
        self.per_client = per_client
        self.max_sessions = max_sessions
        self.retries = retries
        self.loops = loops or os.cpu_count() or 1
        self.sock: socket.socket | None = None
        self.peers: set[tuple] = set()  # (address, port) of every running transfer
        self.by_client: Counter[str] = Counter()
        self.dropped = 0
        self.log_limit = LogLimit()
        self.stopping: str | None = None  # "now" or "gracefully"
        self._lock = threading.Lock()

    def bind(self, listenip: str = "0.0.0.0", listenport: int = 69) -> None:
        """Open the server socket (in the caller's thread, so a port in use raises there)."""
        self.sock = open_udp(listenip, listenport)
        self.sock.setblocking(False)
        ask_destination(self.sock)
        self.listenport = self.sock.getsockname()[1]

    def stop(self, now: bool = False) -> None:
        """End the loops: at once, or once the running transfers are done (none are taken)."""
        self.stopping = "now" if now else self.stopping or "gracefully"

    def listen(self, listenip: str = "0.0.0.0", listenport: int = 69) -> None:
        if self.sock is None:
            self.bind(listenip, listenport)
        loops = [TransferLoop(self) for _ in range(self.loops)]
        threads = [threading.Thread(target=loop.run, name="tftp", daemon=True)
                   for loop in loops[1:]]
        for thread in threads:
            thread.start()
        try:
            loops[0].run()
        finally:
            for thread in threads:
                thread.join()
            self.sock.close()

    def admit(self, peer: tuple) -> bool:
        """Reserve a transfer for `peer` if the limits allow. False: a resent request (ignored)
        or no room (dropped: the client sends it again); Refused: its address already runs
        `per_client` transfers."""
        host = peer[0]
        with self._lock:
            if peer[:2] in self.peers:
                return False
            over = self.by_client[host] >= self.per_client
            if not over and len(self.peers) < self.max_sessions:
                self.peers.add(peer[:2])
                self.by_client[host] += 1
                return True
        if over:
            self.count_drop(host, f"{self.per_client} transfers from it already running")
            raise Refused(NOT_DEFINED, "too many transfers from this address; retry later")
        self.count_drop(host, f"{self.max_sessions} transfers already running")
        return False

    def release(self, peer: tuple) -> None:
        with self._lock:
            self.peers.discard(peer[:2])
            self.by_client[peer[0]] -= 1
            if not self.by_client[peer[0]]:
                del self.by_client[peer[0]]

    def count_drop(self, host: str, why: str) -> None:
        count("tftp_requests", "dropped")
        with self._lock:
            self.dropped += 1
            dropped = self.dropped
        self.log_limit.log(logging.WARNING, "tftp: request from %s dropped (%s); %d so far",
                           host, why, dropped)

    def finished(self, session: Session, failure: str | None, outcome: str) -> None:
        """Log and count a transfer that ended, once: done ("complete"), or why it ended."""
        self.release(session.peer)
        count("tftp_transfers", outcome)
        if not failure:
            count("tftp_sent_bytes", amount=session.size)
        node = self.node_for(session.peer[0]) or session.peer[0]
        if failure:
            log.info("%s tftp %s %s", node, session.name, failure)
        else:
            log.info("%s tftp %s %d bytes %.1f ms", node, session.name, session.size,
                     (time.monotonic() - session.started) * 1000)


class TransferLoop:
    """One epoll loop: takes requests from the shared socket, runs the transfers it took."""

    def __init__(self, server: TftpServer):
        self.server = server
        self.sessions: dict[int, Session] = {}  # by socket fd
        self.epoll = select.epoll()

    def run(self) -> None:
        server, sessions = self.server, self.sessions
        listening = server.sock.fileno()
        self.epoll.register(listening, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        poll, checked = self.epoll.poll, time.monotonic()
        try:
            while server.stopping != "now" and not (server.stopping and not sessions):
                for fd, _ in poll(TICK):
                    try:
                        if fd == listening:
                            self._accept()
                        elif fd in sessions:
                            self._receive(sessions[fd])
                    except Exception as exc:  # one client's packet never stops the server
                        count("tftp_errors", "packet")
                        server.log_limit.log(logging.WARNING, "tftp: packet dropped: %r", exc)
                now = time.monotonic()
                if now - checked >= TICK:
                    checked = now
                    self._check_timeouts(now)
        finally:
            for session in sessions.values():
                session.close()
            self.epoll.close()

    def _accept(self) -> None:
        """Take one waiting request: the next, if any, may wake another loop."""
        try:
            packet, ancdata, _, peer = self.server.sock.recvmsg(65536, socket.CMSG_SPACE(20))
        except OSError:
            return
        if not self.server.stopping:
            self._request(packet, peer, ancdata)

    def _request(self, packet: bytes, peer: tuple, ancdata: list) -> None:
        if packet[:2] not in (b"\0\1", b"\0\2"):
            return  # ACKs, ERRORs... for no transfer: never answered, so errors cannot loop
        try:
            name, _mode, options = parse_request(packet)
            if self.server.admit(peer):
                self._start(peer, destination(ancdata), name, options)
        except Refused as exc:
            count("tftp_requests", REFUSALS.get(exc.code, "refused_other"))
            if exc.code != NOT_DEFINED:
                self.server.log_limit.log(logging.INFO, "tftp: %s:%s refused: %s: %r", peer[0],
                                          peer[1], exc, packet[2:82])
            try:  # with the request's PKTINFO: from the address it was sent to
                self.server.sock.sendmsg([error_packet(exc.code, str(exc))], ancdata, 0, peer)
            except OSError:
                pass

    def _start(self, peer: tuple, local: tuple | None, name: str,
               options: dict[str, str]) -> None:
        """Open the file and the transfer's socket, send the first packet (admitted before)."""
        fd = None
        try:
            fd = open_under(self.server.root, name)
            sock = socket.socket(self.server.sock.family, socket.SOCK_DGRAM)
        except Refused:
            self.server.release(peer)
            raise
        except OSError as exc:  # out of file descriptors: this request is dropped
            if fd is not None:
                os.close(fd)
            self.server.release(peer)
            self.server.count_drop(peer[0], exc.strerror or str(exc))
            return
        session = Session(sock, peer, name, fd, options)
        self.sessions[sock.fileno()] = session
        try:
            sock.setblocking(False)
            if local:
                with contextlib.suppress(OSError):  # a broadcast address: the routing picks
                    sock.bind(local)
            sock.connect(peer)
            self.epoll.register(sock, select.EPOLLIN)
        except OSError as exc:
            return self._finish(session, f"not started: {exc.strerror or exc}", "not_started")
        count("tftp_requests", "started")
        self._send(session, time.monotonic())

    def _receive(self, session: Session) -> None:
        """Take every packet waiting for one transfer; the client's error ends only it."""
        try:
            while True:
                packet = session.sock.recv(65536)
                opcode = packet[1] if len(packet) >= 4 and packet[0] == 0 else 0
                if opcode == ACK and session.on_ack(packet[2] << 8 | packet[3]):
                    if session.done:
                        return self._finish(session, None, "complete")
                    if not self._send(session, time.monotonic()):
                        return
                elif opcode == ERROR:
                    message = packet[4:].split(b"\0")[0].decode(errors="replace")[:80]
                    return self._finish(session, f"ended by the client: {message!r}",
                                        "client_error")
        except BlockingIOError:
            return
        except OSError as exc:  # ICMP port unreachable: the client is gone
            self._finish(session, f"client gone ({exc.strerror})", "client_gone")

    def _check_timeouts(self, now: float) -> None:
        for session in [s for s in self.sessions.values() if s.deadline <= now]:
            session.tries += 1
            if session.tries > self.server.retries:
                self._finish(session, f"abandoned: no answer to {session.tries} sends of "
                                      f"block {max(session.acked + 1, 0)}", "abandoned")
                continue
            self._send(session, now)

    def _send(self, session: Session, now: float) -> bool:
        """Send the transfer's window (again); False if that ended the transfer."""
        try:
            session.send_window(now)
            return True
        except FileChanged as exc:
            with contextlib.suppress(OSError):
                session.sock.send(error_packet(NOT_DEFINED, str(exc)))
            self._finish(session, str(exc), "file_changed")
        except OSError as exc:  # ICMP port unreachable: the client is gone
            self._finish(session, f"client gone ({exc.strerror or exc})", "client_gone")
        return False

    def _finish(self, session: Session, failure: str | None, outcome: str) -> None:
        del self.sessions[session.sock.fileno()]
        session.close()  # also takes the socket out of the epoll set
        self.server.finished(session, failure, outcome)


def make_tftp_server(config: Config, node_for=None) -> TftpServer:
    return TftpServer(config.tftp.root, node_for, per_client=config.tftp.sessions_per_client)
