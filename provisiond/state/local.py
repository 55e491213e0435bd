"""The local files a process reads and writes directly: a JSON object or {}, one changed
under its lock, and whether a file changed since it was last read.

Written once here for every document of the state directory (they were written five, four
and five times). Documents the servers share go through the store (provisiond.state.store);
these are what each server keeps for itself, and the files backend's own primitives.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path, PurePath

from provisiond.atomic import locked, read_json, write_atomic
from provisiond.state.layout import lock_of

Stamp = tuple[int, int, int]
"""(mtime in ns, size, inode) of a file: a file replaced by rename has a new inode even
within one mtime tick."""


def file_stamp(path: PurePath | str) -> Stamp | None:
    """What tells a changed file from an unchanged one without reading it; None when it is
    missing (or a path through a non-directory)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


@contextlib.contextmanager
def edited(path: Path, lock: Path | None = None, durable: bool = True,
           **dump) -> Iterator[dict]:
    """The JSON object at `path` ({} when missing or damaged) to edit in the block, under
    `lock` (default: the document's lock file, `lock_of(path)`); written back atomically
    when the block ends without an error, unless it is unchanged. `dump`: json.dumps
    options (indent, sort_keys)."""
    with locked(lock or lock_of(path)):
        before = read_json(path)
        data = copy.deepcopy(before)
        yield data
        if data != before:
            write_atomic(path, json.dumps(data, **dump), durable=durable)


__all__ = ["Stamp", "edited", "file_stamp", "read_json"]
