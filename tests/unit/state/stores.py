"""Helpers of the store contract tests: the backends under test, forcing a compaction,
an increment loop (also run by child processes)."""

from __future__ import annotations

from provisiond.state.files import FilesStore
from provisiond.state.store import Store

BACKENDS = ["files", "etcd"]


def compact(store: Store) -> None:
    """Make the store forget the history before its newest revision."""
    if isinstance(store, FilesStore):
        store.log.max_bytes, store.log.keep_bytes = 2048, 1024
        for number in range(40):
            store.put("padding.json", b"x" * 100 + str(number).encode())
        return
    store.put("padding.json", b"x")
    store.compact(store.revision())  # etcd keeps the change at the compaction revision


def increment(store: Store, key: str, times: int) -> None:
    for _ in range(times):
        store.update(key, lambda value: str(int(value or b"0") + 1).encode(), wait=120)
