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
revision, so a compare-and-swap against the old one fails. Writers take one flock
(`.store/lock`) for their check and write; readers take none (files are replaced whole).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

from provisiond.atomic import locked, read_json, write_atomic
from provisiond.journal import MAX_LINE, Journal
from provisiond.state.keys import check_expect, check_key, check_prefix, file_mode, is_secret
from provisiond.state.store import Change, Compacted, Entry, Store

HIDDEN = ".store"
LOG_MAX_BYTES = 8 << 20
LOG_KEEP_BYTES = 4 << 20  # a few thousand changes of status-sized values
LOCK_WAIT = 30.0  # seconds; polled, so a gevent worker's other greenlets keep running
POLL = 0.1  # seconds between two reads of the change log in watch
SCAN_EVERY = 1.0  # seconds between two looks for files changed behind the store's back
INLINE_MAX = MAX_LINE - 512  # room for the line's other fields


class FilesStore(Store):
    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.url = f"files://{self.root}"
        self.hidden = self.root / HIDDEN
        self.lock_path = self.hidden / "lock"
        self.log = Journal(self.hidden / "changes.jsonl", LOG_MAX_BYTES, LOG_KEEP_BYTES,
                           mode=0o600)
        self._prepared = False

    # reads (no lock)

    def get(self, key: str) -> Entry | None:
        return self._observe(check_key(key))

    def list(self, prefix: str) -> list[Entry]:
        found = (self._observe(key) for key in self._keys(check_prefix(prefix)))
        return sorted((entry for entry in found if entry), key=lambda e: e.key)

    def revision(self) -> int:
        return self.log.latest_id()

    def watch(self, prefix: str, since: int, timeout: float) -> list[Change]:
        check_prefix(prefix)
        deadline = time.monotonic() + timeout
        next_scan = 0.0
        while True:
            if time.monotonic() >= next_scan:
                self._scan(prefix)
                next_scan = time.monotonic() + SCAN_EVERY
            records = self.log.read_since(since, keep=lambda r: r["key"].startswith(prefix))
            if since < self.log.oldest_id() - 1:
                raise Compacted(f"{self.url}: changes after revision {since} are no longer "
                                f"kept (oldest: {self.log.oldest_id()})")
            changes = [change for change in map(self._change, records) if change]
            if changes:
                return changes
            since = records[-1]["id"] if records else since
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(POLL, left))

    # writes (under the store's lock)

    def put(self, key: str, value: bytes, expect: int | None = None) -> int:
        check_key(key)
        value = bytes(value)
        with locked(self.lock_path, wait=LOCK_WAIT):
            check_expect(key, self._revision(key), expect)
            write_atomic(self.root / key, value, mode=file_mode(key))
            return self._record(key, value)

    def delete(self, key: str, expect: int | None = None) -> bool:
        check_key(key)
        with locked(self.lock_path, wait=LOCK_WAIT):
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
        meta = read_json(self._meta_path(key))
        if found is None and not meta:
            return None
        if found is not None and meta:
            value, stamp = found
            if stamp == meta.get("stat") or _sha256(value) == meta.get("sha256"):
                return Entry(key, value, meta["rev"])
        with locked(self.lock_path, wait=LOCK_WAIT):
            return self._current(key)

    def _revision(self, key: str) -> int | None:
        """The key's revision (lock held): from its meta when the file is as written."""
        meta = read_json(self._meta_path(key))
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
        meta = read_json(self._meta_path(key))
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
                record.update(_inline(value))
        self._prepare()
        revision = self.log.append(record)
        if value is None:
            self._meta_path(key).unlink(missing_ok=True)
        else:
            self._write_meta(key, revision, record["sha256"])
        return revision

    def _write_meta(self, key: str, revision: int, sha256: str) -> None:
        stamp = _stamp(os.stat(self.root / key))
        meta = {"rev": revision, "sha256": sha256, "stat": stamp}
        # not fsynced: a meta lost in a crash makes the file look edited, a new revision
        write_atomic(self._meta_path(key), json.dumps(meta), durable=False)

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
        back (a watch sees them as changes)."""
        keys = set(self._keys(prefix))
        keys.update(self._meta_keys(prefix))
        for key in keys:
            self._observe(key)

    def _keys(self, prefix: str):
        """Every file under the root whose key starts with `prefix` (dot names skipped)."""
        yield from _walk(self.root, prefix, "")

    def _meta_keys(self, prefix: str):
        for key in _walk(self.hidden / "meta", prefix, ".rev"):
            yield key.removesuffix(".rev")


def _walk(top: Path, prefix: str, suffix: str):
    base = prefix.rpartition("/")[0]
    start = top / base if base else top
    for folder, dirs, files in os.walk(start):
        rel = os.path.relpath(folder, top)
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not d.startswith(".") and _may_hold(rel + d + "/", prefix)]
        for name in files:
            key = rel + name
            if not name.startswith(".") and key.startswith(prefix) and key.endswith(suffix):
                yield key


def _may_hold(folder: str, prefix: str) -> bool:
    return folder.startswith(prefix) or prefix.startswith(folder)


def _read_file(path: Path) -> tuple[bytes, list[int]] | None:
    try:
        with open(path, "rb") as handle:
            stamp = _stamp(os.fstat(handle.fileno()))
            return handle.read(), stamp
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _sha256(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def _inline(value: bytes) -> dict:
    """The value as a log line's field ({} when too long for a line)."""
    if len(value) > INLINE_MAX:
        return {}
    try:
        field = {"v": value.decode("utf-8")}
    except UnicodeDecodeError:
        field = {"b64": base64.b64encode(value).decode()}
    if len(json.dumps(field, ensure_ascii=False).encode()) > INLINE_MAX:
        return {}
    return field
