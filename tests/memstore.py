"""A dict-backed Store (provisiond.state.store's interface) for unit tests of the logic
that uses a store: etcd's semantics (one revision counter, compare-and-swap, watch history)
without a backend."""

from __future__ import annotations

import collections
import threading
import time

from provisiond.errors import StaleRevision
from provisiond.state.store import ABSENT, Change, Compacted, Entry, Store


class MemoryStore(Store):
    def __init__(self, url: str = "memory://"):
        self.url = url
        self.data: dict[str, Entry] = {}
        self.history: list[Change] = []
        self.compacted = 0
        self._rev = 0
        self._cond = threading.Condition()

    def get(self, key):
        with self._cond:
            return self.data.get(key)

    def put(self, key, value, expect=None):
        with self._cond:
            self._check(key, expect)
            self._rev += 1
            self.data[key] = Entry(key, bytes(value), self._rev)
            self._changed(Change(key, self._rev, bytes(value)))
            return self._rev

    def delete(self, key, expect=None):
        with self._cond:
            self._check(key, expect)
            if key not in self.data:
                return False
            self._rev += 1
            del self.data[key]
            self._changed(Change(key, self._rev, None))
            return True

    def list(self, prefix):
        with self._cond:
            return [self.data[k] for k in sorted(self.data) if k.startswith(prefix)]

    def revision(self):
        return self._rev

    def watch(self, prefix, since, timeout):
        with self._cond:
            if since < self.compacted:
                raise Compacted(f"revision {since} compacted")
            found = lambda: [c for c in self.history  # noqa: E731
                             if c.revision > since and c.key.startswith(prefix)]
            self._cond.wait_for(found, timeout)
            return found()

    def compact(self, revision: int) -> None:
        with self._cond:
            self.history = [c for c in self.history if c.revision > revision]
            self.compacted = revision

    def _check(self, key, expect):
        if expect is None:
            return
        entry = self.data.get(key)
        if (entry.revision if entry else ABSENT) != expect:
            raise StaleRevision(f"{key}: revision is not {expect}")

    def _changed(self, change):
        self.history.append(change)
        self._cond.notify_all()


class RemoteMemoryStore(MemoryStore):
    """A MemoryStore a server treats as remote (as etcd, whose every read is a request):
    it counts the reads (`reads`: key -> gets) and watch calls, and its watch can be made
    to fail (`watch_error`) or to hang until `watch_released` is set. `batch_revisions`:
    as etcd, a watch from an older revision hands over the changes of that many revisions
    at most (etcd's mvcc: 1,000), the rest to the next calls; `watch_delay`: seconds each
    watch call takes before it looks."""

    remote = True

    def __init__(self, url: str = "memory://remote"):
        super().__init__(url)
        self.reads: collections.Counter = collections.Counter()
        self.watches = 0
        self.watch_error: Exception | None = None
        self.watch_released = threading.Event()
        self.watch_released.set()
        self.batch_revisions: int | None = None
        self.watch_delay = 0.0

    def get(self, key):
        self.reads[key] += 1
        return super().get(key)

    def watch(self, prefix, since, timeout):
        self.watches += 1
        if not self.watch_released.wait(60):
            raise TimeoutError("a test left the watch held")
        if self.watch_error is not None:
            raise self.watch_error
        time.sleep(self.watch_delay)
        changes = super().watch(prefix, since, timeout)
        revisions = sorted({change.revision for change in changes})
        if self.batch_revisions is not None and len(revisions) > self.batch_revisions:
            last = revisions[self.batch_revisions - 1]
            changes = [change for change in changes if change.revision <= last]
        return changes
