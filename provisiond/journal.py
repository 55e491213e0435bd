"""A bounded, append-only JSON-lines file with consecutive ids, shared by every process.

The event stream and the audit record are both journals: the CLI, every HTTP worker, the
boot servers and job runners append to the same file under an flock, each line one JSON
object carrying its `id`. Readers never lock: appends are whole lines, and a reader ignores
a last line that has no newline yet. When the file passes `max_bytes` its oldest lines are
dropped (the newest `keep_bytes` stay), so ids keep growing and a reader can tell what it
missed from `oldest_id()`.

Lines are in id order, so `read_since` finds its first line by bisecting byte offsets:
a reader polling a 8 MiB journal reads a few KiB, not the file.

With a shared store (etcd) a journal is a StoreJournal instead: one key per record, so every
server writes to and reads the same one (`journal_on` picks).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from provisiond.atomic import locked, write_atomic
from provisiond.errors import Conflict

MAX_LINE = 16 << 10  # a longer record is refused by `append` (ValueError)
WAIT_POLL = 0.15  # seconds between two looks at a journal file in `wait`
TAIL_SEARCH = 64 * MAX_LINE  # bytes latest_id reads back for a record when the tail is none


def journal_on(store, prefix: str, path: Path, max_bytes: int, keep_bytes: int,
               mode: int = 0o640, keep_records: int = 4000
               ) -> "Journal | StoreJournal":
    """The journal of `store` (a provisiond.state Store): today's file at `path` with the
    files store (the state dir as it was), else `keep_records` records under `prefix` on
    the store (a read lists them: ~250 bytes each)."""
    if store.url.startswith("files://"):
        return Journal(path, max_bytes, keep_bytes, mode)
    return StoreJournal(store, prefix, keep_records)


class Journal:
    def __init__(self, path: Path, max_bytes: int, keep_bytes: int, mode: int = 0o640):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes
        self.mode = mode

    def append(self, record: dict, after: int = 0) -> int:
        """Write `record` with the next id (returned), above `after` too. Raises OSError, or
        ValueError for a record that is not JSON or longer than MAX_LINE."""
        with locked(self.lock_path):
            last = max(self.latest_id(), after)
            line = json.dumps({"id": last + 1, **record}, separators=(",", ":"),
                              ensure_ascii=False, default=str) + "\n"
            data = line.encode()
            if len(data) > MAX_LINE:
                raise ValueError(f"journal record of {len(data)} bytes (at most {MAX_LINE})")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, self.mode)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # after a torn line (a crash mid-append), not in it
                os.write(fd, data)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size > self.max_bytes:
                self._trim()
            return last + 1

    def latest_id(self) -> int:
        """The newest id written, 0 for an empty or missing journal. A last line that is
        no record (torn by a crash, zeros after a power cut) is passed over: read as 0 it
        made the ids start again at 1."""
        for span in (2 * MAX_LINE, TAIL_SEARCH):
            for line in reversed(self._tail_lines(span)):
                if found := _line_id(line):
                    return found
        return 0

    def oldest_id(self) -> int:
        """The oldest id still held, 0 for an empty journal."""
        try:
            with open(self.path, "rb") as handle:
                return _line_id(handle.readline(MAX_LINE + 1))
        except FileNotFoundError:
            return 0

    def read_since(self, after_id: int, limit: int = 1000,
                   keep: Callable[[dict], bool] | None = None) -> list[dict]:
        """Up to `limit` records with id > after_id, oldest first (only those `keep` accepts)."""
        found: list[dict] = []
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._first_after(handle, after_id))
                for record in _records(handle):
                    if record["id"] > after_id and (keep is None or keep(record)):
                        found.append(record)
                        if len(found) >= limit:
                            break
        except FileNotFoundError:
            pass
        return found

    def wait(self, after_id: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a record after `after_id` (or a trim); True
        when the journal may hold one."""
        deadline = time.monotonic() + timeout
        start = self._signature()
        while self.latest_id() <= after_id and self._signature() == start:
            if time.monotonic() >= deadline:
                return False
            time.sleep(WAIT_POLL)
        return True

    def _signature(self) -> tuple[int, int, int] | None:
        """What changes when the journal is appended to or trimmed (replaced)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _first_after(self, handle, after_id: int) -> int:
        """Offset of a line at or before the first line whose id > after_id."""
        low, high = 0, os.fstat(handle.fileno()).st_size
        while high - low > MAX_LINE:
            middle = (low + high) // 2
            handle.seek(middle)
            handle.readline(MAX_LINE + 1)  # the rest of a line cut in the middle
            start = handle.tell()
            line = handle.readline(MAX_LINE + 1)
            found = _line_id(line) if line.endswith(b"\n") else 0
            if not found or found > after_id:  # 0: no record (half written, torn, zeros)
                high = middle  # a line without an id moved low past the records before it
            else:
                low = start
        return low

    def _tail_lines(self, span: int = 2 * MAX_LINE) -> list[bytes]:
        """The complete lines of the journal's last `span` bytes."""
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                start = max(0, size - span)
                handle.seek(start)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        lines = chunk.split(b"\n")[:-1]  # the last piece: empty or a line being written
        if start and lines:
            lines = lines[1:]  # cut by the seek
        return [line for line in lines if line]

    def _trim(self) -> None:
        """Keep the newest `keep_bytes`, cut at a line start (the lock is held)."""
        with open(self.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - self.keep_bytes))
            if handle.tell():
                handle.readline()
            kept = handle.read()
        write_atomic(self.path, kept, mode=self.mode, durable=False)


class StoreJournal:
    """A journal on a shared store: each record a key `<prefix><time ns>-<random>` (created
    with put(expect=ABSENT)), its id the store revision of that put, so ids grow in the
    order the store took the records, whichever server wrote them. `read_since` lists the
    prefix (a watch from an old revision hands its history over in pieces, and a reader
    that skipped past a piece would lose events); `wait` is the store's watch.

    Bounded: about once per keep/4 appends (by chance, so no writer needs a count shared
    by all) one lists the records and deletes the oldest beyond `keep`, and
    `<prefix without '/'>.trimmed` notes the newest id deleted. A trim per append would
    move the whole journal each time; this holds at most about 1.25 x keep records."""

    def __init__(self, store, prefix: str, keep: int):
        self.store, self.prefix, self.keep = store, prefix, keep
        self.trimmed_key = prefix.rstrip("/") + ".trimmed"
        self.trim_every = max(1, keep // 4)

    def append(self, record: dict) -> int:
        data = json.dumps(record, separators=(",", ":"), ensure_ascii=False,
                          default=str).encode()
        if len(data) > MAX_LINE:
            raise ValueError(f"journal record of {len(data)} bytes (at most {MAX_LINE})")
        key = f"{self.prefix}{time.time_ns():020d}-{secrets.token_hex(4)}"
        revision = self.store.put(key, data, expect=0)
        if secrets.randbelow(self.trim_every) == 0:
            self.trim()
        return revision

    def trim(self) -> None:
        """Delete the oldest records beyond `keep` (any server may; a key already deleted
        by another is skipped)."""
        entries = self._entries()
        gone = entries[:max(0, len(entries) - self.keep)]
        if not gone:
            return
        for entry in gone:
            self.store.delete(entry.key)
        self.store.update(self.trimmed_key, lambda raw: str(max(
            _int(raw), gone[-1].revision)).encode())

    def latest_id(self) -> int:
        """The store's revision: no record newer than it exists yet."""
        return self.store.revision()

    def oldest_id(self) -> int:
        """A lower bound of the oldest id held (ids at or below `trimmed` are gone)."""
        entry = self.store.get(self.trimmed_key)
        return _int(entry.value) + 1 if entry else 0

    def read_since(self, after_id: int, limit: int = 1000,
                   keep: Callable[[dict], bool] | None = None) -> list[dict]:
        found: list[dict] = []
        for entry in self._entries():
            record = _parsed(entry.value) if entry.revision > after_id else None
            if record is not None:
                record = {"id": entry.revision, **record}
                if keep is None or keep(record):
                    found.append(record)
                    if len(found) >= limit:
                        break
        return found

    def wait(self, after_id: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a record after `after_id` (the store's watch;
        the deletions of a trim are passed over)."""
        deadline = time.monotonic() + timeout
        since = after_id
        while True:
            try:
                changes = self.store.watch(self.prefix, since,
                                           max(0.0, deadline - time.monotonic()))
            except Conflict:  # Compacted: history gone; the keys may hold newer records
                return True
            if any(change.value is not None for change in changes):
                return True
            if not changes or time.monotonic() >= deadline:
                return False
            since = changes[-1].revision

    def _entries(self) -> list:
        return sorted(self.store.list(self.prefix), key=lambda entry: entry.revision)


def _parsed(raw: bytes) -> dict | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _int(raw: bytes | None) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def _records(handle) -> Iterator[dict]:
    for line in handle:
        if not line.endswith(b"\n"):
            return  # being written
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("id"), int):
            yield record


def _line_id(line: bytes) -> int:
    try:
        value = json.loads(line).get("id")
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0
