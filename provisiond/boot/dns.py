"""provisiond's DNS server: precomputed answers for the nodes, one UDP loop.

The hot path parses only the header and question by hand and glues the precomputed tail to
the query's own question; anything unusual goes to dnslib. Names outside the zone get
NXDOMAIN, or go to `config.dns.upstream` when one is set.
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import threading
import time

from dnslib import DNSRecord, RCODE

from provisiond.boot.dns_zone import Zone
from provisiond.boot.table import BootTable
from provisiond.boot.udp import UdpServer, open_udp
from provisiond.config import Config

log = logging.getLogger("provisiond.boot")


NO_OTHER_RECORDS = bytes(6)  # ancount, nscount, arcount
# Counting keys made once: the fast path adds to a dict and builds nothing.
REPLY_KEYS = {code: ("dns_replies", RCODE.get(code, str(code)).lower()) for code in range(16)}
ANSWERED, FORWARDED, DROPPED = (("dns_queries", handling)
                                for handling in ("answered", "forwarded", "dropped"))


def parse_question(data: bytes) -> tuple[bytes, bytes, int] | None:
    """(lowercased wire name, type+class, end offset) of a plain one-question query."""
    if len(data) < 17 or data[2] & 0xF8 or data[4:6] != b"\0\1":
        return None  # a response, not a QUERY opcode, or not exactly one question
    if data[6:12] == NO_OTHER_RECORDS:
        # Nothing after the question: no label walk (length bytes are < 64, so lower()
        # changes only letters).
        return data[12:-4].lower(), data[-4:], len(data)
    pos, end = 12, len(data)
    while pos < end:
        length = data[pos]
        if length == 0:
            break
        if length > 63:
            return None
        pos += length + 1
    if pos + 5 > end:
        return None
    return data[12:pos + 1].lower(), data[pos + 1:pos + 5], pos + 5


class DnsServer(UdpServer):
    name = protocol = "dns"

    def __init__(self, config: Config, table: BootTable, sock: socket.socket | None = None):
        upstream = config.dns.upstream_address
        super().__init__(sock or open_udp(config.dns.bind, config.dns.port))
        self.config = config
        self.zone = Zone(config, table)
        self.forwarder = Forwarder(upstream, self.sock) if upstream else None

    def update_table(self, table: BootTable) -> None:
        self.zone = Zone(self.config, table)

    def handle(self, data: bytes, peer: tuple) -> None:
        question = parse_question(data)
        hit = question and self.zone.tails.get(question[:2])
        if hit:
            rcode, counts, tail = hit
            flags = bytes((0x84 | (data[2] & 0x01), rcode))
            self.sock.sendto(data[:2] + flags + counts + data[12:question[2]] + tail, peer)
            self.counts[ANSWERED] += 1
            self.counts[REPLY_KEYS[rcode & 15]] += 1
        else:
            self._slow(data, peer)

    def _slow(self, data: bytes, peer: tuple) -> None:
        """Anything not precomputed: dnslib parses it; zone misses are NXDOMAIN or forwarded."""
        try:
            query = DNSRecord.parse(data)
        except Exception:
            self.counts[DROPPED] += 1
            return  # not DNS: drop, as a real server does
        if query.header.qr or not query.questions:
            self.counts[DROPPED] += 1
            return
        name = str(query.q.qname).rstrip(".")
        if self.forwarder and not self.zone.holds(name):
            self.counts[FORWARDED if self.forwarder.forward(data, peer) else DROPPED] += 1
            return
        key = (name.lower(), query.q.qtype)
        reply = query.reply()
        for rr in self.zone.records.get(key, []):
            reply.add_answer(rr)
        if not reply.rr:
            reply.add_auth(self.zone.soa)
            reply.header.rcode = RCODE.NOERROR if key[0] in self.zone.names else RCODE.NXDOMAIN
        self.sock.sendto(reply.pack(), peer)
        self.counts[ANSWERED] += 1
        self.counts[REPLY_KEYS[reply.header.rcode & 15]] += 1

    def tick(self) -> None:
        if self.forwarder:
            self.forwarder.expire()

    def close(self) -> None:
        super().close()
        if self.forwarder:
            self.forwarder.close()


MAX_PENDING = 4096


class Forwarder:
    """Relays queries to the upstream server and its replies back (one reader thread)."""

    def __init__(self, upstream: tuple[str, int], reply_sock: socket.socket,
                 timeout: float = 5.0):
        self.upstream = upstream
        self.reply_sock = reply_sock
        self.timeout = timeout
        family = socket.AF_INET6 if ":" in upstream[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.connect(self.upstream)
        self.pending: dict[int, tuple[bytes, tuple, float]] = {}
        threading.Thread(target=self._read, name="dns-forward", daemon=True).start()

    def forward(self, data: bytes, peer: tuple) -> bool:
        """Send with a random unused query id, so an off-path spoofer must guess it; beyond
        MAX_PENDING queries in flight a query is dropped (the client asks again): False."""
        if len(self.pending) >= MAX_PENDING:
            return False
        query_id = secrets.randbelow(0x10000)
        while query_id in self.pending:
            query_id = secrets.randbelow(0x10000)
        self.pending[query_id] = (data[:2], peer, time.monotonic())
        self.sock.send(struct.pack("!H", query_id) + data[2:])
        return True

    def _read(self) -> None:
        """Relay replies until either socket is closed. Other errors cost one reply: an
        ICMP port unreachable from a dead upstream (ECONNREFUSED) once ended this thread,
        and with it every forwarded answer for good."""
        while self.sock.fileno() >= 0 and self.reply_sock.fileno() >= 0:
            try:
                data = self.sock.recv(65535)
            except OSError as exc:
                log.debug("dns-forward: upstream %s: %s", self.upstream, exc)
                continue
            if len(data) < 12:
                continue
            entry = self.pending.pop(struct.unpack("!H", data[:2])[0], None)
            if entry:
                try:
                    self.reply_sock.sendto(entry[0] + data[2:], entry[1])
                except OSError as exc:
                    log.debug("dns-forward: reply to %s: %s", entry[1], exc)

    def expire(self) -> None:
        limit = time.monotonic() - self.timeout
        for key in [k for k, v in list(self.pending.items()) if v[2] < limit]:
            self.pending.pop(key, None)

    def close(self) -> None:
        self.sock.close()
