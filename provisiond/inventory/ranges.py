"""Node ranges (`n[001-128]`, `n[1-4],gpu[1-2]`) through ClusterShell's NodeSet."""

from __future__ import annotations

import ipaddress

from ClusterShell.NodeSet import NodeSet, NodeSetException

from provisiond.errors import InvalidInput
from provisiond.inventory.model import node_sort_key


def expand(pattern: str) -> list[str]:
    """All names a range names, in natural order; a bad pattern is InvalidInput."""
    try:
        names = list(NodeSet(pattern))
    except (NodeSetException, ValueError) as exc:
        raise InvalidInput(f"invalid node range {pattern!r}: {exc}") from None
    if not names:
        raise InvalidInput(f"node range {pattern!r} names no node")
    return sorted(names, key=node_sort_key)


def fold(names: list[str]) -> str:
    """The shortest range naming exactly `names`."""
    return str(NodeSet.fromlist(names)) if names else ""


def consecutive_ipv4(first: str, count: int) -> list[str]:
    """`count` addresses from `first` up; overflowing 255.255.255.255 is InvalidInput."""
    start = ipaddress.IPv4Address(first)
    if int(start) + count - 1 > int(ipaddress.IPv4Address("255.255.255.255")):
        raise InvalidInput(f"{count} consecutive addresses from {first} overflow IPv4")
    return [str(start + i) for i in range(count)]


def consecutive_macs(first: str, count: int) -> list[str]:
    value = int(first.replace(":", ""), 16)
    if value + count - 1 > 0xFFFFFFFFFFFF:
        raise InvalidInput(f"{count} consecutive MACs from {first} overflow")
    return [":".join(f"{value + i:012x}"[j:j + 2] for j in range(0, 12, 2))
            for i in range(count)]
