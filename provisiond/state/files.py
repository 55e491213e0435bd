"""The files backend: the default, embedded store. A key is a file under the state directory
and its value is that file's bytes, so the state dir stays what it was (YAML and JSON that
people read, edit and keep in git).

Revisions live beside it in `<state>/.store/` (git-ignored):
- `changes.jsonl`, a bounded journal (provisiond.journal): one line per change, its id is the
  change's revision, so the journal's newest id is the store's revision. A line carries the
  new value when it fits a journal line and is not a secret, else only its sha256;
- `meta/<key>.rev`: the key's revision, the sha256 of the value and the file's
  (inode, size, mtime) as the store wrote it.

A file whose stat no longer matches its meta is hashed: a different content (edited by hand,
`git pull`, a crash between the value's rename and the meta's) is registered as a new
revision, so a compare-and-swap against the old one fails. A writer stages the new file
(written, fsynced) first, then holds the flock of its key's stripe (`.store/locks/N`, one
of 64) for its check, rename and log line only; readers take none (files are replaced
whole).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path

from provisiond.atomic import locked, read_json, staged, write_atomic
from provisiond.config import CACHE_NAME
from provisiond.errors import ProvisiondError
from provisiond.journal import MAX_LINE, Journal
from provisiond.state.keys import check_expect, check_key, check_prefix, file_mode, is_secret
from provisiond.state.store import Change, Compacted, Entry, Store

HIDDEN = ".store"
LOG_MAX_BYTES = 8 << 20
LOG_KEEP_BYTES = 4 << 20  # a few thousand changes of status-sized values
LOCK_WAIT = 30.0  # seconds; polled, so a gevent worker's other greenlets keep running
LOCK_STRIPES = 64  # writers of keys in different stripes check and rename at once
POLL = 0.1  # seconds between two reads of the change log in watch
SCAN_EVERY = 1.0  # seconds between two looks for files changed behind the store's back
LOOKED_KEPT = 256  # watches remembered (prefix and revision): where each read up to
LINE_ROOM = 64  # bytes of a log line besides its record's fields: the id, the separators
META_BYTES = 512  # a meta file's size: each write covers the whole of the one before
NOT_DOCUMENTS = frozenset({CACHE_NAME, "blobs"})
"""Never listed: image layer trees (root file systems) and content-addressed blobs are no
documents, and a list of '' would read every byte of them."""


class StoreFileError(ProvisiondError):
    """The state directory cannot be read or written (permissions, a full disk...)."""

    code = "store_io"


def _reported(method):
    """The method with OSError turned into one line naming the key and the cause."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            where = exc.filename or self.root
            raise StoreFileError(f"{self.url}: {method.__name__} {args[0] if args else ''}: "
                                 f"{where}: {exc.strerror or exc}") from None

    return call


class FilesStore(Store):
    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.url = f"files://{self.root}"
        self.hidden = self.root / HIDDEN
        self.log = Journal(self.hidden / "changes.jsonl", LOG_MAX_BYTES, LOG_KEEP_BYTES,
                           mode=0o600)
        self._prepared = False
        self._seen: dict[str, dict[str, list[int] | None]] = {}  # prefix -> key -> stamp
        self._looked: dict[tuple[str, int], int] = {}  # (prefix, since) -> read up to, in vain
        self._scan_lock = threading.Lock()

    # reads (no lock)

    @_reported
    def get(self, key: str) -> Entry | None:
        return self._observe(check_key(key))

    @_reported
    def list(self, prefix: str) -> list[Entry]:
        found = (self._observe(key) for key in self._keys(check_prefix(prefix)))
        return sorted((entry for entry in found if entry), key=lambda e: e.key)

    def revision(self) -> int:
        return self.log.latest_id()

    @_reported
    def watch(self, prefix: str, since: int, timeout: float) -> list[Change]:
        check_prefix(prefix)
        deadline = time.monotonic() + timeout
        next_scan = 0.0
        # where an earlier watch of the prefix from `since` read up to, finding nothing:
        # serve's watch of inventory.yaml read every change since the inventory's last one
        # (a storm's phases) ten times a second, 10-25% of a core on an idle server
        looked = self._looked.get((prefix, since), since)
        while True:
            if time.monotonic() >= next_scan:
                self._scan(prefix)
                next_scan = time.monotonic() + SCAN_EVERY
            latest = self.log.latest_id()
            records = self.log.read_since(looked, keep=lambda r: r["key"].startswith(prefix))
            if looked < self.log.oldest_id() - 1:
                raise Compacted(f"{self.url}: changes after revision {since} are no longer "
                                f"kept (oldest: {self.log.oldest_id()})")
            if not records and looked > latest:
                # the log was removed (`git clean -X` of a state dir kept in git): its new
                # revisions start low again, and a watch from the old one saw none of them
                raise Compacted(f"{self.url}: revision {since} is newer than the change "
                                f"log's ({latest}): it was removed or reset")
            changes = [change for change in map(self._change, records) if change]
            if changes:
                return changes
            looked = records[-1]["id"] if records else max(looked, latest)
            if len(self._looked) >= LOOKED_KEPT:
                self._looked.clear()
            self._looked[prefix, since] = looked
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(POLL, left))

    # writes (under the lock of the key's stripe)

    @_reported
    def put(self, key: str, value: bytes, expect: int | None = None) -> int:
        check_key(key)
        value = bytes(value)
        # written and fsynced before the lock, which covers only the check and the rename
        with staged(self.root / key, value, mode=file_mode(key)) as commit:
            with self._locked(key):
                check_expect(key, self._revision(key), expect)
                commit()
                return self._record(key, value)

    @_reported
    def delete(self, key: str, expect: int | None = None) -> bool:
        check_key(key)
        with self._locked(key):
            revision = self._revision(key)
            check_expect(key, revision, expect)
            if revision is None:
                return False
            (self.root / key).unlink(missing_ok=True)
            self._record(key, None)
            return True

    # a key's revision

    def _observe(self, key: str) -> Entry | None:
        """The key as it is now; a file changed behind the store's back is registered."""
        found = _read_file(self.root / key)
        meta = self._read_meta(key)
        if found is None and not meta:
            return None
        if found is not None and meta:
            value, stamp = found
            if stamp == meta.get("stat") or _sha256(value) == meta.get("sha256"):
                return Entry(key, value, meta["rev"])
        try:
            with self._locked(key):
                return self._current(key)
        except PermissionError:
            # a reader that may not write the state dir (an unprivileged CLI user) cannot
            # register the change: it sees the value, at the last revision known
            if found is None:
                return None
            return Entry(key, found[0], meta.get("rev") or self.log.latest_id())

    def _revision(self, key: str) -> int | None:
        """The key's revision (lock held): from its meta when the file is as written."""
        meta = self._read_meta(key)
        try:
            stamp = _stamp(os.stat(self.root / key))
        except (FileNotFoundError, NotADirectoryError):
            stamp = None
        if meta and stamp == meta.get("stat"):
            return meta["rev"]
        entry = self._current(key)
        return entry.revision if entry else None

    def _current(self, key: str) -> Entry | None:
        """Read the key with the lock held; a file changed, created or removed without the
        store is recorded as a change of its own (a new revision)."""
        found = _read_file(self.root / key)
        meta = self._read_meta(key)
        if found is None:
            if meta:
                self._record(key, None)
            return None
        value, _ = found
        if meta and _sha256(value) == meta.get("sha256"):
            self._write_meta(key, meta["rev"], meta["sha256"])  # only its stat changed
            return Entry(key, value, meta["rev"])
        return Entry(key, value, self._record(key, value, edited=True))

    def _record(self, key: str, value: bytes | None, edited: bool = False) -> int:
        """Log a change (the lock is held); returns its revision."""
        record: dict = {"key": key, "op": "delete" if value is None else "put"}
        if value is not None:
            record["sha256"] = _sha256(value)
            if edited:
                record["edited"] = True
            if not is_secret(key):
                record.update(_inline(value, MAX_LINE - LINE_ROOM - _size(record)))
        self._prepare()
        # above the key's last revision even when the log lost its tail (a power cut: the
        # log is not fsynced, the meta may have reached the disk): a revision given twice
        # to one key lets a writer holding the older value's compare-and-swap succeed
        revision = self.log.append(record, after=self._read_meta(key).get("rev", 0))
        if value is None:
            self._meta_path(key).unlink(missing_ok=True)
        else:
            self._write_meta(key, revision, record["sha256"])
        return revision

    def _write_meta(self, key: str, revision: int, sha256: str) -> None:
        """Overwrite the key's meta in place: no temp file and rename, two file system
        journal operations fewer per put. A reader seeing it half written (or after a
        crash) finds its check wrong, as if there were none: it takes the lock and reads
        again, or registers the file as changed (a new revision)."""
        meta = {"rev": revision, "sha256": sha256, "stat": _stamp(os.stat(self.root / key))}
        text = json.dumps({**meta, "check": _check(meta)}).encode().ljust(META_BYTES)
        path = self._meta_path(key)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, file_mode(key))
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, file_mode(key))
        try:
            os.pwrite(fd, text, 0)  # no O_TRUNC: ext4 flushes a truncated file on close
        finally:
            os.close(fd)

    def _read_meta(self, key: str) -> dict:
        """The key's meta; {} when there is none or its check fails (half written)."""
        meta = read_json(self._meta_path(key))
        check = meta.pop("check", None)
        return meta if meta and check == _check(meta) else {}

    def _locked(self, key: str):
        """The lock of the key's stripe, held for a check and write of the key (the change
        log has a lock of its own, which orders the revisions)."""
        stripe = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4]) % LOCK_STRIPES
        return locked(self.hidden / "locks" / str(stripe), wait=LOCK_WAIT)

    def _prepare(self) -> None:
        """Create `.store/`, ignored by git (a state dir kept in git holds the values)."""
        if not self._prepared:
            self.hidden.mkdir(parents=True, exist_ok=True)
            ignore = self.hidden / ".gitignore"
            if not ignore.exists():
                write_atomic(ignore, "*\n")
            self._prepared = True

    def _meta_path(self, key: str) -> Path:
        return self.hidden / "meta" / f"{key}.rev"

    # watch

    def _change(self, record: dict) -> Change | None:
        """The change a log line records; None when its value is not in the line and the
        file has changed since (a later line records that change)."""
        key, revision = record["key"], record["id"]
        if record["op"] == "delete":
            return Change(key, revision, None)
        if "v" in record:
            return Change(key, revision, record["v"].encode())
        if "b64" in record:
            return Change(key, revision, base64.b64decode(record["b64"]))
        found = _read_file(self.root / key)
        if found is None or _sha256(found[0]) != record.get("sha256"):
            return None
        return Change(key, revision, found[0])

    def _scan(self, prefix: str) -> None:
        """Register the files under `prefix` changed, created or removed behind the store's
        back (a watch sees them as changes). A file whose stat is the one this store saw
        last is not read again: a watch on 10,000 status files stats them, no more."""
        with self._scan_lock:
            self._scan_locked(prefix)

    def _scan_locked(self, prefix: str) -> None:
        seen = self._seen.setdefault(prefix, {})
        if not seen:  # the first look: keys removed while no one watched
            for key in self._meta_keys(prefix):
                seen[key] = None
        now = dict(_walk(self.root, prefix, ""))
        for key in seen.keys() - now.keys():
            self._observe(key)
            seen.pop(key, None)
        for key, stamp in now.items():
            if seen.get(key) != stamp:
                self._observe(key)
                seen[key] = stamp

    def _keys(self, prefix: str):
        """Every file under the root whose key starts with `prefix` (dot names skipped)."""
        for key, _ in _walk(self.root, prefix, ""):
            yield key

    def _meta_keys(self, prefix: str):
        for key, _ in _walk(self.hidden / "meta", prefix, ".rev"):
            yield key.removesuffix(".rev")


def _walk(top: Path, prefix: str, suffix: str):
    """(key, stamp) of the regular files under `top` whose key starts with `prefix`."""
    base = prefix.rpartition("/")[0]
    start = top / base if base else top
    for folder, dirs, files in os.walk(start):
        rel = os.path.relpath(folder, top)
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not d.startswith(".") and rel + d not in NOT_DOCUMENTS
                   and _may_hold(rel + d + "/", prefix)]
        for name in files:
            key = rel + name
            if name.startswith(".") or not key.startswith(prefix) or not key.endswith(suffix):
                continue
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield key, _stamp(st)


def _may_hold(folder: str, prefix: str) -> bool:
    return folder.startswith(prefix) or prefix.startswith(folder)


def _read_file(path: Path) -> tuple[bytes, list[int]] | None:
    """The file's bytes and stamp; None unless it is a regular file (a FIFO in an image
    tree would block a plain open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    with open(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return handle.read(), _stamp(st)


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _check(meta: dict) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def _inline(value: bytes, room: int) -> dict:
    """The value as a log line's field ({} when longer than `room` bytes, what the line's
    other fields leave: a long key's line with a value under a fixed bound was refused
    after the value's file was replaced)."""
    if len(value) > room:
        return {}
    try:
        field = {"v": value.decode("utf-8")}
    except UnicodeDecodeError:
        field = {"b64": base64.b64encode(value).decode()}
    if _size(field) > room:
        return {}
    return field


def _size(fields: dict) -> int:
    return len(json.dumps(fields, ensure_ascii=False).encode())
