"""What a server reads on every request, answered from a copy the store's watch keeps current.

With etcd every read is an HTTP round trip to a member: a boot storm of 1,000 nodes on one
server read the store 3,100-7,200 times (the token signing key with each script, the image
manifest with each blob, ...; bench/README.md). A WatchedCopy answers `get` from a dict. The
first get of a key reads the store; from then on one loop per followed prefix (a thread, a
greenlet in the gevent workers) applies the changes the store's watch hands over, so a
change made through any server reaches the copy as soon as etcd passes it on (~0.1 s).

Staleness is bounded: a value is answered from the copy only while a watch call that began
at most `max_age` seconds ago has returned (it has then seen every change made before it
began, unless it handed over only part of a backlog: see BATCH_REVISIONS), or the key itself was read from the store within `max_age`. A watch that fails or
hangs (a member gone, the network) thus costs at most one read of each key per `max_age`;
a store that cannot be read then fails the request, as a direct read does, rather than
answering with an older value. A revoked credential is refused once etcd has passed the
change on, and at the latest `max_age` seconds after it was written.

A prefix no get asked for in `idle` seconds is no longer followed (an idle server sends
etcd nothing) and its values are dropped; the next get reads the store and follows again.

The files store needs none of this: its reads are a stat and a small file read, and its
watch polls a change log. `follow(store)` gives the store itself there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from provisiond.errors import ProvisiondError, Unavailable
from provisiond.state.store import Compacted, Entry, Store

log = logging.getLogger("provisiond.state")

WAIT = 1.0  # seconds one watch call waits for a change
MAX_AGE = 3.0
"""The oldest a value answered may be (seconds): more than two watch calls of WAIT and
their round trips, so that a working watch on a busy 2-core server never falls back to
reads, and short enough for a revocation that missed the watch (see above)."""
IDLE = 60.0  # seconds without a get after which a prefix is no longer followed
RETRY = 1.0  # seconds between watch calls after one failed
BATCH_REVISIONS = 1000
"""etcd hands a watch from an older revision its changes this many revisions at a time (its
mvcc's watchBatchMaxRevs; measured: 2,500 puts behind, calls of 1,000, 1,000 and 500): a
call that returned as many may not have caught up, and proves nothing yet."""
GATHER = 0.05
"""Seconds the loop waits after changes before it watches again: on a prefix that changes
all the time (the credentials of a storm's nodes) one watch call takes the changes of
50 ms, not one each."""


@dataclass
class _Kept:
    entry: Entry | None
    revision: int
    """of the change or read it came from; 0 for a key read as absent"""
    read_at: float = float("-inf")
    """monotonic time its read from the store began (-inf: from the watch)"""
    watched: bool = True
    """whether the watch hands over every later change: not so for a read during which
    the watch applied changes (one of them, to a key not kept yet, may have been this
    key's, newer than what the read found): that value lives max_age, then is read again"""


@dataclass
class _Read:
    """A read of one key from the store, under way: what the callers that wait for it take."""

    done: threading.Event = field(default_factory=threading.Event)
    entry: Entry | None = None
    error: BaseException | None = None


@dataclass
class _Followed:
    """One prefix: its kept keys, the revision its watch is at, and when a watch call that
    returned began."""

    prefix: str
    since: int
    pid: int = field(default_factory=os.getpid)
    kept: dict[str, _Kept] = field(default_factory=dict)
    proven: float = float("-inf")
    asked: float = field(default_factory=time.monotonic)
    running: bool = True
    failing: bool = False  # the last watch call failed (logged once per outage)


class WatchedCopy:
    """`get` like a Store's: for the keys under `prefixes` from the copy, any other key
    from the store. What a server writes reaches its copy through the watch too: readers
    that must not refuse what was just written (a new credential, a new API token) look
    in the store before they refuse."""

    def __init__(self, store: Store, prefixes: tuple[str, ...], max_age: float = MAX_AGE,
                 wait: float = WAIT, idle: float = IDLE):
        self.store = store
        self.url = store.url
        self.prefixes = prefixes
        self.max_age = max_age
        self.wait = wait
        self.idle = idle
        self._followed: dict[str, _Followed] = {}
        self._reading: dict[str, _Read] = {}  # key -> its read from the store under way
        self._lock = threading.Lock()  # the dicts above and every _Followed
        self._starting = threading.Lock()
        self._unstarted = float("-inf")  # when a watch last failed to start

    def get(self, key: str) -> Entry | None:
        followed = self._follow(key)
        if followed is None:
            return self.store.get(key)
        with self._lock:
            followed.asked = time.monotonic()
            kept = self._current(followed, key)
        return kept.entry if kept is not None else self._read(followed, key)

    def _current(self, followed: _Followed, key: str) -> _Kept | None:
        """What is kept of `key` if it is recent enough to answer (the lock is held)."""
        kept = followed.kept.get(key)
        now = time.monotonic()
        if kept is not None and ((kept.watched and now - followed.proven <= self.max_age)
                                 or now - kept.read_at <= self.max_age):
            return kept
        return None

    def _read(self, followed: _Followed, key: str) -> Entry | None:
        """The key from the store, one read at a time: the greenlets of a storm that ask at
        once for a key take the one read's answer, or its failure (with the store away,
        one after another they each waited for the read before theirs to fail)."""
        with self._lock:
            kept = self._current(followed, key)  # read by another meanwhile
            if kept is not None:
                return kept.entry
            flight = self._reading.get(key)
            if flight is None:
                flight = self._reading[key] = _Read()
                before, since = followed.kept.get(key), followed.since
            else:
                before = since = None
        if since is None:
            flight.done.wait()  # the store's read is bounded (etcd: RETRY_FOR)
            if flight.error is not None:
                raise flight.error
            return flight.entry
        flight.error = Unavailable(f"{self.url}: the read of {key} was interrupted")
        try:
            started = time.monotonic()
            flight.entry = entry = self.store.get(key)
            flight.error = None
            with self._lock:
                # unless the watch changed the key meanwhile: then its changes go on from there
                if followed.running and followed.kept.get(key) is before:
                    revision = entry.revision if entry else before.revision if before else 0
                    followed.kept[key] = _Kept(entry, revision, started,
                                               watched=followed.since == since)
            return entry
        except Exception as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._reading[key]
            flight.done.set()

    def _follow(self, key: str) -> _Followed | None:
        """The followed prefix of `key`, its watch started if it was not running; None for
        a key under no prefix, or when the store cannot say its revision (then the get
        reads the store, and fails as it would). Callers wait for one that starts it at
        most `wait` s, and do not try again for RETRY s after one failed: the callers of a
        store that is away fail together, not each after the one before."""
        prefix = next((p for p in self.prefixes if key.startswith(p)), None)
        if prefix is None:
            return None
        with self._lock:
            followed = self._followed.get(prefix)
        if followed is not None and followed.running and followed.pid == os.getpid():
            return followed
        if not self._starting.acquire(timeout=self.wait):
            return None
        try:
            with self._lock:
                followed = self._followed.get(prefix)
            if followed is not None and followed.running and followed.pid == os.getpid():
                return followed
            if time.monotonic() - self._unstarted < RETRY:
                return None
            try:
                since = self.store.revision()  # before any read: the watch misses nothing
            except (ProvisiondError, OSError) as exc:
                log.debug("store copy: %s: %s", prefix, exc)
                self._unstarted = time.monotonic()
                return None
            followed = _Followed(prefix, since)
            with self._lock:
                self._followed[prefix] = followed
            threading.Thread(target=self._run, args=(followed,), daemon=True,
                             name=f"watch {prefix}").start()
            return followed
        finally:
            self._starting.release()

    def _run(self, followed: _Followed) -> None:
        try:
            while self._watch(followed):
                pass
        except Exception:  # a bug: logged; the next get reads and follows anew
            log.exception("store copy: the watch of %s failed", followed.prefix)
        finally:
            with self._lock:
                followed.running = False
                followed.kept.clear()
                if self._followed.get(followed.prefix) is followed:
                    del self._followed[followed.prefix]

    def _watch(self, followed: _Followed) -> bool:
        """One watch call and its changes applied; False once the prefix is idle."""
        with self._lock:
            if time.monotonic() - followed.asked > self.idle:
                return False
            since = followed.since
        started = time.monotonic()
        try:
            try:
                changes = self.store.watch(followed.prefix, since, self.wait)
            except Compacted:  # changes missed: what is kept may be old, read it again
                since = self.store.revision()
                with self._lock:
                    followed.kept.clear()
                    followed.since = since
                return True
        except (ProvisiondError, OSError) as exc:  # the store away: reads after max_age
            (log.debug if followed.failing else log.warning)(
                "store copy: cannot watch %s on %s: %s; reading the store meanwhile",
                followed.prefix, self.url, exc)
            followed.failing = True
            time.sleep(RETRY)
            return True
        followed.failing = False
        with self._lock:
            for change in changes:
                kept = followed.kept.get(change.key)
                if kept is not None and change.revision > kept.revision:
                    entry = (Entry(change.key, change.value, change.revision)
                             if change.value is not None else None)
                    followed.kept[change.key] = _Kept(entry, change.revision)
            if changes:
                followed.since = max(since, changes[-1].revision)
            # part of a backlog (a watch back after an outage): the later calls hand over
            # the rest, changes made before this one began among them
            if len({change.revision for change in changes}) < BATCH_REVISIONS:
                followed.proven = started
        if changes:
            time.sleep(GATHER)
        return True


FOLLOWED = ("inventory.yaml", "images/", "secrets/", "tokens.json")
"""What a boot server reads per request: the inventory's revision (the boot table), image
manifests, the token signing key and nodes' credentials, the API tokens."""


def follow(store: Store, prefixes: tuple[str, ...] = FOLLOWED) -> Store | WatchedCopy:
    """What a server process reads `prefixes` through: a WatchedCopy of a store whose reads
    go over the network (etcd), the store itself otherwise."""
    return WatchedCopy(store, prefixes) if store.remote else store
