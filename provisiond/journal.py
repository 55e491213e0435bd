"""A bounded, append-only JSON-lines file with consecutive ids, shared by every process.

The event stream and the audit record are both journals: the CLI, every HTTP worker, the
boot servers and job runners append to the same file under an flock, each line one JSON
object carrying its `id`. Readers never lock: appends are whole lines, and a reader ignores
a last line that has no newline yet. When the file passes `max_bytes` its oldest lines are
dropped (the newest `keep_bytes` stay), so ids keep growing and a reader can tell what it
missed from `oldest_id()`.

Lines are in id order, so `read_since` finds its first line by bisecting byte offsets:
a reader polling a 8 MiB journal reads a few KiB, not the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from provisiond.atomic import locked, write_atomic

MAX_LINE = 16 << 10  # a longer record is refused by `append` (ValueError)


class Journal:
    def __init__(self, path: Path, max_bytes: int, keep_bytes: int, mode: int = 0o640):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes
        self.mode = mode

    def append(self, record: dict) -> int:
        """Write `record` with the next id (returned). Raises OSError, or ValueError for a
        record that is not JSON or longer than MAX_LINE."""
        with locked(self.lock_path):
            last = self.latest_id()
            line = json.dumps({"id": last + 1, **record}, separators=(",", ":"),
                              ensure_ascii=False, default=str) + "\n"
            data = line.encode()
            if len(data) > MAX_LINE:
                raise ValueError(f"journal record of {len(data)} bytes (at most {MAX_LINE})")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, self.mode)
            try:
                os.write(fd, data)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size > self.max_bytes:
                self._trim()
            return last + 1

    def latest_id(self) -> int:
        """The newest id written, 0 for an empty or missing journal."""
        lines = self._tail_lines()
        return _line_id(lines[-1]) if lines else 0

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

    def _first_after(self, handle, after_id: int) -> int:
        """Offset of a line at or before the first line whose id > after_id."""
        low, high = 0, os.fstat(handle.fileno()).st_size
        while high - low > MAX_LINE:
            middle = (low + high) // 2
            handle.seek(middle)
            handle.readline(MAX_LINE + 1)  # the rest of a line cut in the middle
            start = handle.tell()
            line = handle.readline(MAX_LINE + 1)
            if not line.endswith(b"\n"):
                high = middle
            elif _line_id(line) > after_id:
                high = middle
            else:
                low = start
        return low

    def _tail_lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                start = max(0, size - 2 * MAX_LINE)
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
