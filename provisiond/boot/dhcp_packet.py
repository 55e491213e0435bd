"""DHCPv4 packets (RFC 2131/2132) as plain values: decode a request, encode a reply.

Only what a boot server needs; struct does the fixed header, options are a TLV walk.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from provisiond.errors import InvalidInput

HEADER = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")
MAGIC = b"\x63\x82\x53\x63"
MIN_SIZE = HEADER.size + len(MAGIC)

DISCOVER, OFFER, REQUEST, DECLINE, ACK, NAK, RELEASE, INFORM = range(1, 9)

OPT_PAD, OPT_END = 0, 255
OPT_SUBNET, OPT_ROUTER, OPT_DNS, OPT_HOSTNAME, OPT_DOMAIN = 1, 3, 6, 12, 15
OPT_REQUESTED_IP, OPT_LEASE, OPT_MSG_TYPE, OPT_SERVER_ID = 50, 51, 53, 54
OPT_VENDOR_CLASS, OPT_USER_CLASS, OPT_ARCH, OPT_UUID = 60, 77, 93, 97
OPT_TFTP_SERVER, OPT_BOOTFILE, OPT_VENDOR_INFO, OPT_IPXE = 66, 67, 43, 175
IPXE_NO_PXEDHCP = 176  # in OPT_IPXE: 1 = take the first offer, wait for no ProxyDHCP


class MalformedPacket(InvalidInput):
    """A datagram is not a DHCP request we can read."""


@dataclass
class Request:
    """The fields of a client's DHCP message that decide the answer."""

    xid: int
    flags: int
    ciaddr: str
    giaddr: str
    chaddr: bytes
    mac: str
    options: dict[int, bytes] = field(default_factory=dict)

    @property
    def msg_type(self) -> int:
        value = self.options.get(OPT_MSG_TYPE, b"")
        return value[0] if len(value) == 1 else 0


def decode(data: bytes) -> Request:
    """Parse a BOOTREQUEST; anything else raises MalformedPacket."""
    if len(data) < MIN_SIZE or data[HEADER.size:MIN_SIZE] != MAGIC:
        raise MalformedPacket("not a DHCP packet")
    (op, htype, hlen, _hops, xid, _secs, flags, ciaddr, _yiaddr, _siaddr, giaddr, chaddr,
     _sname, _file) = HEADER.unpack_from(data)
    if op != 1 or htype != 1 or hlen != 6:
        raise MalformedPacket("not an Ethernet BOOTREQUEST")
    mac = chaddr[:6].hex(":")
    return Request(xid, flags, socket.inet_ntoa(ciaddr), socket.inet_ntoa(giaddr),
                   chaddr, mac, parse_options(data, MIN_SIZE))


def parse_options(data: bytes, pos: int) -> dict[int, bytes]:
    """Walk the option TLVs; a truncated option ends the walk with what was read."""
    options: dict[int, bytes] = {}
    end = len(data)
    while pos < end:
        code = data[pos]
        if code == OPT_END:
            break
        if code == OPT_PAD:
            pos += 1
            continue
        if pos + 1 >= end:
            raise MalformedPacket("truncated option")
        length = data[pos + 1]
        value = data[pos + 2:pos + 2 + length]
        if len(value) != length:
            raise MalformedPacket("truncated option")
        options[code] = options.get(code, b"") + value
        pos += 2 + length
    return options


def encode_options(options: list[tuple[int, bytes]]) -> bytes:
    """TLVs in the given order; long values are split per RFC 3396."""
    out = bytearray()
    for code, value in options:
        for start in range(0, max(len(value), 1), 255):
            chunk = value[start:start + 255]
            out += bytes((code, len(chunk))) + chunk
    return bytes(out)


def encode_reply(request: Request, yiaddr: str, siaddr: str, bootfile: bytes,
                 options: bytes) -> bytes:
    """A BOOTREPLY to `request` carrying already-encoded options (ending with OPT_END)."""
    header = HEADER.pack(2, 1, 6, 0, request.xid, 0, request.flags,
                         socket.inet_aton(request.ciaddr), socket.inet_aton(yiaddr),
                         socket.inet_aton(siaddr), socket.inet_aton(request.giaddr),
                         request.chaddr, b"", bootfile[:127])
    return header + MAGIC + options + b"\xff"


def encode_request(mac: str, msg_type: int, xid: int = 1,
                   options: list[tuple[int, bytes]] = ()) -> bytes:
    """A client's BOOTREQUEST: used by tests and the benchmark's sanity checks."""
    chaddr = bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0")
    header = HEADER.pack(1, 1, 6, 0, xid, 0, 0x8000, bytes(4), bytes(4), bytes(4), bytes(4),
                         chaddr, b"", b"")
    opts = [(OPT_MSG_TYPE, bytes((msg_type,))), *options]
    return header + MAGIC + encode_options(opts) + b"\xff"


def decode_reply(data: bytes) -> tuple[str, str, bytes, dict[int, bytes]]:
    """(yiaddr, siaddr, file, options) of a BOOTREPLY, for tests."""
    fields = HEADER.unpack_from(data)
    return (socket.inet_ntoa(fields[8]), socket.inet_ntoa(fields[9]),
            fields[13].rstrip(b"\0"), parse_options(data, MIN_SIZE))
