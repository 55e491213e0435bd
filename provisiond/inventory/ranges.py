"""Node ranges (`n[001-128]`, `n[1-4],gpu[1-2]`) through ClusterShell's NodeSet.

Never with node groups: ClusterShell resolves `@group` through groups.conf, whose shipped
`local` source is a shell command with the group name pasted in (a range in an apply file
ran commands). Every NodeSet here is made with RESOLVER_NOGROUP, and `@` is refused."""

from __future__ import annotations

import copy
import ipaddress
import re

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from provisiond.errors import InvalidInput
from provisiond.inventory.model import node_sort_key
from provisiond.inventory.values import normalise_mac

ADDRESS_FIELDS = ("mac", "ipaddr", "ipaddr6")  # of each netdev; and bmc.address


MAX_RANGE_NODES = 100_000  # 10x the largest cluster the design targets
EVENT_NAMES_BYTES = 8000  # of names an event lists (a journal line is at most 16 KiB)
MAX_NAMES_TEXT = 2000  # of a range shown in one line (an audit target, a job's target)
_GROUP_RE = re.compile(r"\[([^\]]*)\]")
_ITEM_RE = re.compile(r"\s*(\d+)(?:-(\d+)(?:/(\d+))?)?\s*")
_OPERATOR_RE = re.compile(r"([,!&^])(?![^\[]*\])")  # NodeSet's set operators, outside brackets


def expand(pattern: str) -> list[str]:
    """All names a range names, in natural order; a bad pattern, or one naming more than
    MAX_RANGE_NODES, is InvalidInput."""
    if "@" in pattern:
        raise InvalidInput(f"invalid node range {pattern!r}: node groups (@name) are not "
                           "supported")
    if _most_names(pattern) > MAX_RANGE_NODES:
        raise InvalidInput(f"node range {pattern!r} names more than {MAX_RANGE_NODES} nodes")
    try:
        names = list(NodeSet(pattern, resolver=RESOLVER_NOGROUP))
    except (NodeSetException, ValueError) as exc:
        raise InvalidInput(f"invalid node range {pattern!r}: {exc}") from None
    if not names:
        raise InvalidInput(f"node range {pattern!r} names no node")
    return sorted(names, key=node_sort_key)


def _most_names(pattern: str) -> int:
    """How many names `pattern` names at most, counted from its bracket groups without
    expanding them: NodeSet builds every number first (seconds for millions, an assertion
    at 1e9). A part after `!` (minus) or `&` (intersection) adds no name."""
    pieces = _OPERATOR_RE.split(pattern)
    total = 0
    for operator, part in zip([","] + pieces[1::2], pieces[::2]):
        if operator in "!&":
            continue
        count = 1
        for group in _GROUP_RE.findall(part):
            count *= sum(_item_size(item) for item in group.split(","))
        total += count
    return total


def _item_size(item: str) -> int:
    match = _ITEM_RE.fullmatch(item)
    if not match:
        return 1  # not a number range: NodeSet reports it
    low, high, step = int(match[1]), int(match[2] or match[1]), int(match[3] or 1)
    return max(0, (high - low) // max(step, 1) + 1)


def fold(names: list[str]) -> str:
    """The shortest range naming exactly `names`."""
    return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP)) if names else ""


def names_text(names: list[str], noun: str) -> str:
    """The names as a range, or when that is long (scattered names) the start of it and
    how many: audit and event records are bounded lines."""
    text = fold(names)
    if len(text) <= MAX_NAMES_TEXT:
        return text
    return f"{fold(names_head(names, MAX_NAMES_TEXT // 2))},... ({len(names)} {noun}s)"


def names_head(names: list[str], budget: int = EVENT_NAMES_BYTES) -> list[str]:
    """The first names, as many as fit in `budget` characters (an event is one bounded
    journal line; its `count` says how many there were)."""
    used = 0
    for index, name in enumerate(names):
        used += len(name) + 4
        if used > budget:
            return names[:index]
    return names


def consecutive(first, count: int, what: str) -> list:
    """`count` values from `first` up: a MAC, or an IPv4 or IPv6 address (`what` names the
    field). A value that is none of these (a BMC host name, a typo, a number YAML read, an
    address with a scope id, which ipaddress would drop) is repeated: the schema or the
    uniqueness check then names the problem."""
    if not isinstance(first, str) or "%" in first:
        return [first] * count
    try:
        if what.endswith("mac"):
            value = int(normalise_mac(first).replace(":", ""), 16)
            return _counted(value, count, 48, first, what, lambda v: ":".join(
                f"{v:012x}"[j:j + 2] for j in range(0, 12, 2)))
        start = ipaddress.ip_address(first)
    except (ValueError, AttributeError):
        return [first] * count
    return _counted(int(start), count, start.max_prefixlen, first, what,
                    lambda v: str(ipaddress.ip_address(v) if start.version == 4
                                  else ipaddress.IPv6Address(v)))


def _counted(value: int, count: int, bits: int, first: str, what: str, show) -> list[str]:
    if value + count - 1 >= 1 << bits:
        raise InvalidInput(f"{what}: {count} consecutive values from {first} overflow")
    return [show(value + i) for i in range(count)]


def spread_addresses(data: dict, count: int) -> list[dict]:
    """`count` copies of a record's data for `count` nodes of a range: each netdev's mac,
    ipaddr and ipaddr6 and the bmc address count up from the value given, one per node.
    `node add`, `node set` and `apply` all hand out addresses through this."""
    copies = [copy.deepcopy(data) for _ in range(count)]
    if count == 1:
        return copies
    for path in _address_paths(data):
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        values = consecutive(parent[path[-1]], count, ".".join(path))
        for target, value in zip(copies, values):
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
    return copies


def _address_paths(data: dict) -> list[tuple[str, ...]]:
    paths = []
    netdevs = data.get("netdevs")
    for dev, fields in (netdevs.items() if isinstance(netdevs, dict) else []):
        if isinstance(fields, dict):
            paths += [("netdevs", dev, key) for key in ADDRESS_FIELDS if fields.get(key)]
    bmc = data.get("bmc")
    if isinstance(bmc, dict) and bmc.get("address"):
        paths.append(("bmc", "address"))
    return paths
