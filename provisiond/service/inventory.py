"""Reading the inventory for the service layer: the two record kinds, a snapshot kept per
process while the file does not change, record ETags, and list pages.

A snapshot saves each request parsing the whole inventory (120 ms for 10,000 nodes): a
stat of the file tells whether it changed (every write renames a new file in), and names,
sort keys and merged records are worked out once per version.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from provisiond.config import Config
from provisiond.errors import InvalidInput, NodeNotFound, ProfileNotFound, NotFound
from provisiond.inventory.merge import Node, merge_node
from provisiond.inventory.model import Inventory, Record, check_name, node_sort_key
from provisiond.inventory.ranges import expand, fold
from provisiond.inventory.store import InventoryStore, Version
from provisiond.state.layout import Layout

SNAPSHOTS_KEPT = 4  # state dirs one process reads (tests make many)
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
_SEQ_RE = re.compile(r"[0-9]{1,18}")
# Records one API write may name: the largest cluster the design targets. A write of
# 100,000 new nodes held a gevent worker (and the inventory lock) for over 30 s, and
# gunicorn killed the worker with every boot it was serving. The CLI has no such bound.
MAX_API_NAMES = 10_000


@dataclass(frozen=True)
class Kind:
    """What differs between nodes and profiles."""

    noun: str

    @property
    def key(self) -> str:
        return f"{self.noun}s"

    @property
    def not_found(self) -> type[NotFound]:
        return NodeNotFound if self.noun == "node" else ProfileNotFound

    def records(self, inventory: Inventory) -> dict[str, Record]:
        return getattr(inventory, self.key)

    def names(self, pattern: str, most: int | None = None) -> list[str]:
        """The names `pattern` gives: a node range, or one profile name; each a valid name,
        and (given `most`) at most that many."""
        names = expand_names(pattern) if self.noun == "node" else [pattern]
        if most is not None and len(names) > most:
            raise InvalidInput(f"{pattern[:40]!r} names {len(names)} {self.key}; one request "
                               f"may name at most {most}: split it", field="names")
        for name in names:
            self.check_name(name)
        return names

    def check_name(self, name: str, field: str = "names") -> str:
        try:
            return check_name(name, f"{self.noun} name")
        except ValueError as exc:
            raise InvalidInput(str(exc), field=field) from None

    def existing(self, inventory: Inventory, pattern: str, most: int | None = None
                 ) -> list[str]:
        """The names of `pattern` (at most `most`), each of which must exist."""
        names = self.names(pattern, most)
        records = self.records(inventory)
        missing = [n for n in names if n not in records]
        if missing:
            raise self.not_found(f"no such {self.noun}: {fold(missing)}")
        return names

    def present(self, inventory: Inventory, pattern: str) -> list[str]:
        """The names of `pattern` that exist, as a listing shows them (the API's
        `?names=`): a range may name none; one plain name that does not exist is not
        found, as a `show` of it is."""
        names = self.names(pattern)
        records = self.records(inventory)
        if names == [pattern] and pattern not in records:
            raise self.not_found(f"no such {self.noun}: {pattern}")
        return [n for n in names if n in records]


NODES, PROFILES = Kind("node"), Kind("profile")


def expand_names(pattern: str, field: str = "names") -> list[str]:
    """ranges.expand, its error naming the input field."""
    try:
        return expand(pattern)
    except InvalidInput as exc:
        raise InvalidInput(str(exc), field=field) from None


def record_etag(record: Record | None) -> str | None:
    """The ETag of a stored record: a digest of its data (the same data, the same tag)."""
    if record is None:
        return None
    text = json.dumps(record.to_data(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def revision_etag(revision: int) -> str:
    """The ETag of a whole collection (every node, every profile): the inventory revision."""
    return f"rev-{revision}"


@dataclass
class Snapshot:
    """One version of the inventory, with what readers derive from it, made on demand."""

    inventory: Inventory
    _sorted: dict[str, tuple[list[str], list[tuple]]] = field(default_factory=dict)
    _merged: dict[str, Node] = field(default_factory=dict)
    _profile_data: dict | None = None

    @property
    def revision(self) -> int:
        return self.inventory.revision

    def sorted_names(self, kind: Kind) -> tuple[list[str], list[tuple]]:
        """The kind's names in natural order, and their sort keys (for bisecting)."""
        if kind.key not in self._sorted:
            names = sorted(kind.records(self.inventory), key=node_sort_key)
            self._sorted[kind.key] = (names, [node_sort_key(n) for n in names])
        return self._sorted[kind.key]

    def merged(self, name: str) -> Node:
        node = self._merged.get(name)
        if node is None:
            if self._profile_data is None:
                self._profile_data = {n: r.to_data()
                                      for n, r in self.inventory.profiles.items()}
            node = self._merged[name] = merge_node(self.inventory, name, self._profile_data)
        return node


_snapshots: dict[str, tuple[tuple, Version, Snapshot]] = {}


def snapshot(config: Config) -> Snapshot:
    """The inventory as it is now: the last snapshot of this state dir if the file has not
    changed since (its stat, on the files store), else the snapshot of the store's current
    version (the same one while that version is: the one this process just wrote needs no
    reading; on etcd a read of the store each time)."""
    path = Layout.of(config).inventory
    inventory = InventoryStore(config)
    stamp = inventory.file_stamp()
    kept = _snapshots.get(str(path))
    if kept is not None and stamp is not None and kept[0] == stamp:
        return kept[2]
    version = inventory.current()
    if kept is not None and kept[1] is version:
        current = kept[2]
    else:
        current = Snapshot(version.inventory)
    _snapshots.pop(str(path), None)
    if len(_snapshots) >= SNAPSHOTS_KEPT:
        _snapshots.pop(next(iter(_snapshots)))
    _snapshots[str(path)] = (stamp, version, current)
    return current


def encode_cursor(key: str | int) -> str:
    """The `continue` token for a page that ended at `key`: the key as text (a name is a DNS
    label, a sequence number digits), so the API's schema can say exactly what it takes."""
    return str(key)


def decode_cursor(token: str | None, kind: type = str):
    """The key a `continue` token names (None without one); for numbers, InvalidInput if it
    is not one of ours. Any text is a name to page after (natural order)."""
    if token is None:
        return None
    if kind is int:
        if not _SEQ_RE.fullmatch(token):
            raise InvalidInput("not a continue token from a previous page", field="continue")
        return int(token)
    return token


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1-{MAX_LIMIT}", field="limit")
    return limit


def page_of_names(names: list[str], keys: list[tuple], after: str | None, limit: int,
                  keep: Callable[[str], bool] | None = None) -> tuple[list[str], str | None]:
    """Up to `limit` names that follow `after` in natural order and `keep` accepts, and the
    cursor of the next page (None at the end). A cursor is a name, not an offset: records
    added or deleted between pages cause no repeat and no gap among the others."""
    start = 0 if after is None else bisect.bisect_right(keys, node_sort_key(after))
    found: list[str] = []
    for index in range(start, len(names)):
        name = names[index]
        if keep is None or keep(name):
            found.append(name)
            if len(found) == limit:
                more = any(keep is None or keep(n) for n in _rest(names, index + 1))
                return found, (encode_cursor(name) if more else None)
    return found, None


def _rest(names: list[str], start: int) -> Iterable[str]:
    return (names[i] for i in range(start, len(names)))
