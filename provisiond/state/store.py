"""The store interface: every document provisiond's parts share goes through one of these.

Keys are relative POSIX paths, the same names the files backend uses under the state
directory (`inventory.yaml`, `secrets.yaml`, `status/n001.json`, ...; provisiond.state.layout
names them). Values are bytes. Every key carries its mod revision: a store-wide counter that
grows with every change to any key (etcd's mod_revision; the files backend keeps its own).

The operations are etcd's v3 ones, so both backends give the same guarantees:
- `get` a key with its revision;
- `put` with compare-and-swap: `expect=None` writes whatever is there, `expect=ABSENT`
  only creates, `expect=R` replaces only the value at revision R (else StaleRevision);
- `delete`, also with `expect`;
- `list` a prefix, sorted by key;
- `watch` a prefix from a revision: the changes after it, in revision order.

`update` is the one read-modify-write loop everything uses (no caller holds a lock across
its own read and write).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass

from provisiond.errors import Conflict, StaleRevision, Unavailable

ABSENT = 0
"""`expect=ABSENT`: the key must not exist (revisions start at 1)."""


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    revision: int
    """the key's mod revision"""


@dataclass(frozen=True)
class Change:
    key: str
    revision: int
    value: bytes | None
    """the new value; None when the key was deleted"""


class Compacted(Conflict):
    """A watch asked for changes older than the store still holds: read the whole prefix
    again (`list`), then watch from `Store.revision()`."""

    code = "compacted"


class Store(abc.ABC):
    """One backend (provisiond.state.files, provisiond.state.etcd)."""

    url: str
    """where the store is: `files:///state/dir` or `etcd://host:port[,host:port...]`"""
    remote = False
    """Whether each read is a request over the network (etcd): a server then answers its
    per-request reads from a copy its watch keeps (provisiond.state.watched)."""

    @abc.abstractmethod
    def get(self, key: str) -> Entry | None:
        """The key's value and revision; None if it does not exist."""

    @abc.abstractmethod
    def put(self, key: str, value: bytes, expect: int | None = None) -> int:
        """Store `value`; returns the key's new revision. With `expect`, only if the key's
        revision is `expect` (ABSENT: does not exist), else StaleRevision and nothing
        changes."""

    @abc.abstractmethod
    def delete(self, key: str, expect: int | None = None) -> bool:
        """Remove the key (False if it did not exist); `expect` as for put."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[Entry]:
        """Every key starting with `prefix`, sorted by key."""

    @abc.abstractmethod
    def revision(self) -> int:
        """The store's newest revision (what a watch started now starts after)."""

    @abc.abstractmethod
    def watch(self, prefix: str, since: int, timeout: float) -> list[Change]:
        """The changes to keys under `prefix` with revision > `since`, oldest first; waits
        up to `timeout` seconds for the first one (then []). Compacted when `since` is
        older than the history kept."""

    def close(self) -> None:
        """Release connections (the store is not used after)."""

    def update(self, key: str, change: Callable[[bytes | None], bytes | None],
               wait: float = 30.0) -> int | None:
        """Read-modify-write `key` until no one else wrote it between: `change` gets the
        current value (None: absent) and returns the new one (None: delete). Returns the
        new revision (None when deleted). Unavailable after `wait` seconds of conflicts."""
        deadline = time.monotonic() + wait
        while True:
            entry = self.get(key)
            value = change(entry.value if entry else None)
            expect = entry.revision if entry else ABSENT
            try:
                if value is None:
                    if entry is not None:
                        self.delete(key, expect=expect)
                    return None
                return self.put(key, value, expect=expect)
            except StaleRevision:
                if time.monotonic() > deadline:
                    raise Unavailable(f"{key}: written by others for {wait:.0f} s; "
                                      "try again") from None
