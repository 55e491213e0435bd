"""The DNS zone of the nodes, precomputed as wire-format answer tails.

Every node name (short and with the domain) gets A and AAAA, every reserved address a PTR,
and the domain apex SOA and NS. A lookup key is the query's question (name lowercased, type,
class); the value is everything a reply needs after the question.
"""

from __future__ import annotations

import ipaddress
import struct
import time

from dnslib import AAAA, A, DNSHeader, DNSQuestion, DNSRecord, NS, PTR, QTYPE, RR, SOA

from provisiond.boot.table import BootTable, SkippedRecords, reverse_name
from provisiond.config import Config

NOERROR, NXDOMAIN = 0, 3


def wire_name(name: str) -> bytes:
    """A name in wire format, lowercased: the lookup key's first part."""
    labels = [label for label in name.lower().rstrip(".").split(".") if label]
    return b"".join(bytes((len(lab),)) + lab.encode() for lab in labels) + b"\0"


SIMPLE_TYPES = (QTYPE.A, QTYPE.AAAA, QTYPE.PTR)


def packed(address: str, version: int) -> list[int]:
    """An address's bytes for dnslib (which misparses forms such as 64:ff9b::10.0.0.5);
    a scoped (fe80::1%eth0) or IPv4-mapped (::ffff:10.0.0.5) one means nothing in DNS."""
    parsed = ipaddress.ip_address(address)
    if (parsed.version != version or getattr(parsed, "scope_id", None)
            or getattr(parsed, "ipv4_mapped", None)):
        raise ValueError(f"{address!r} is not a plain IPv{version} address")
    return list(parsed.packed)


def simple_rr(qtype: int, ttl: int, rdata) -> bytes:
    """An A, AAAA or PTR answer whose owner is the question name (pointer 0xC00C)."""
    if qtype == QTYPE.PTR:
        data = wire_name(str(rdata.label))
    else:
        data = bytes(rdata.data)
    return struct.pack("!HHHIH", 0xC00C, qtype, 1, ttl, len(data)) + data


class Zone:
    """Answers for every name of the table; `tails[(name, type+class)] = (rcode, counts, tail)`."""

    def __init__(self, config: Config, table: BootTable):
        self.domain = config.server.domain.lower().rstrip(".")
        self.ttl = config.dns.ttl
        self.ns_name = f"provisiond.{self.domain}"
        self.soa = RR(self.domain, QTYPE.SOA, ttl=self.ttl, rdata=SOA(
            self.ns_name, f"hostmaster.{self.domain}",
            (int(time.time()), 3600, 600, 86400, self.ttl)))
        self.records: dict[tuple[str, int], list[RR]] = {}
        self._add(self.domain, QTYPE.NS, NS(self.ns_name))
        if ":" in config.server.address:
            self._add(self.ns_name, QTYPE.AAAA, AAAA(packed(config.server.address, 6)))
        else:
            self._add(self.ns_name, QTYPE.A, A(packed(config.server.address, 4)))
        skipped = SkippedRecords("dns zone")
        left_out = set()
        for node in table.nodes.values():
            records = skipped.build(f"node {node.name}", lambda: self._node_records(node))
            if records is None:
                left_out.add(node.name)
            for record in records or []:
                self._add(*record)
        for entry in table.by_ip.values():
            if entry.node in left_out:
                continue
            ptr = skipped.build(f"node {entry.node}", lambda: self._ptr(entry.ipaddr, entry.node))
            if ptr:
                self._add(*ptr)
        skipped.report()
        self.names = {name for name, _ in self.records} | {self.domain}
        self.tails = {key: value for key, value in self._tails()}

    def _node_records(self, node) -> list[tuple]:
        """A node's A, AAAA and IPv6 PTR records, all parsed before any is added."""
        primary = node.primary_netdev
        if not primary:
            return []
        dev = primary[1]
        if f"{node.name}.{self.domain}" == self.ns_name:
            raise ValueError(f"{self.ns_name} is this server's name")
        records = []
        for name in (node.name, f"{node.name}.{self.domain}"):
            wire_name(name)  # a name that cannot go on the wire skips the node here
            if dev.ipaddr:
                records.append((name, QTYPE.A, A(packed(dev.ipaddr, 4))))
            if dev.ipaddr6:
                records.append((name, QTYPE.AAAA, AAAA(packed(dev.ipaddr6, 6))))
        if dev.ipaddr6:
            records.append(self._ptr(dev.ipaddr6, node.name))
        return records

    def _ptr(self, address: str, node: str) -> tuple:
        return reverse_name(address), QTYPE.PTR, PTR(f"{node}.{self.domain}")

    def _add(self, name: str, qtype: int, rdata) -> None:
        self.records.setdefault((name.lower(), qtype), []).append(
            RR(name, qtype, ttl=self.ttl, rdata=rdata))

    def _tails(self):
        if (self.domain, QTYPE.SOA) not in self.records:
            self.records[(self.domain, QTYPE.SOA)] = [self.soa]
        for (name, qtype), rrs in self.records.items():
            key = (wire_name(name), struct.pack("!HH", qtype, 1))
            yield key, self.answer(name, qtype, rrs)

    def answer(self, name: str, qtype: int, rrs: list[RR]) -> tuple[int, bytes, bytes]:
        """(rcode, the 8 count bytes, the bytes after the question) for a reply."""
        if qtype in SIMPLE_TYPES:
            tail = b"".join(simple_rr(qtype, rr.ttl, rr.rdata) for rr in rrs)
            return NOERROR, struct.pack("!HHHH", 1, len(rrs), 0, 0), tail
        reply = DNSRecord(DNSHeader(qr=1, aa=1), q=DNSQuestion(name, qtype))
        for rr in rrs:
            reply.add_answer(rr)
        wire = reply.pack()
        question_end = 12 + len(wire_name(name)) + 4
        return NOERROR, wire[4:12], wire[question_end:]

    def holds(self, name: str) -> bool:
        """True if `name` is in our zone (so we answer NXDOMAIN rather than forward)."""
        name = name.lower().rstrip(".")
        return name == self.domain or name.endswith("." + self.domain) or "." not in name
