"""IPv6 router advertisements on the lab bridge, so iPXE does not wait ~13 s for one.

Run inside the lab namespace: `python3 -m pvlab.ra br0 fd99:77::`. It answers router
solicitations at once and advertises every second; the router lifetime is 0 (not a default
router), the prefix is on-link and autonomous, and the M/O flags are clear (no DHCPv6).
"""

from __future__ import annotations

import select
import socket
import struct
import sys

ICMPV6_RS, ICMPV6_RA = 133, 134
ALL_NODES, ALL_ROUTERS = "ff02::1", "ff02::2"


def advertisement(prefix: str, mac: bytes) -> bytes:
    """An RA message: hop limit 64, no flags, lifetime 0, one /64 prefix, our link address."""
    header = struct.pack("!BBHBBHII", ICMPV6_RA, 0, 0, 64, 0, 0, 0, 0)
    prefix_opt = struct.pack("!BBBBIII", 3, 4, 64, 0xC0, 3600, 1800, 0)
    prefix_opt += socket.inet_pton(socket.AF_INET6, prefix)
    return header + prefix_opt + struct.pack("!BB", 1, 1) + mac


def open_socket(ifname: str) -> socket.socket:
    index = socket.if_nametoindex(ifname)
    sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
    group = socket.inet_pton(socket.AF_INET6, ALL_ROUTERS) + struct.pack("@I", index)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, group)
    return sock


def serve(ifname: str, prefix: str, interval: float = 1.0) -> None:
    """Advertise forever: on every solicitation and every `interval` seconds."""
    mac = bytes.fromhex(open(f"/sys/class/net/{ifname}/address").read().strip().replace(":", ""))
    message = advertisement(prefix, mac)
    sock = open_socket(ifname)
    index = socket.if_nametoindex(ifname)
    while True:
        readable, _, _ = select.select([sock], [], [], interval)
        if readable:
            data = sock.recv(2048)
            if not data or data[0] != ICMPV6_RS:
                continue
        try:
            sock.sendto(message, (ALL_NODES, 0, 0, index))
        except OSError:
            pass  # no carrier or no link-local address yet: the next round will do


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
