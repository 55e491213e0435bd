"""Crash-safe file replacement and advisory locks, for every file provisiond writes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from provisiond.errors import Unavailable


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` so that a reader or a crash sees the old or the new file.

    The data goes to a temp file in the same directory, is fsynced, then renamed over the
    target; the directory is fsynced so the rename itself survives a power cut. With
    `durable=False` (derived data that can be rebuilt) both fsyncs are skipped.
    """
    with staged(path, data, mode, durable) as commit:
        commit()


@contextlib.contextmanager
def staged(path: Path, data: bytes | str, mode: int = 0o644,
           durable: bool = True) -> Iterator[Callable[[], None]]:
    """write_atomic in two steps: the data is written (and fsynced) to a temp file first;
    the block calls the function it gets to rename it over `path` (a writer holding a lock
    for its check and rename only, not for the writing). Not called: nothing changes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    committed = []
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        yield lambda: committed.append(os.replace(tmp, path))
    finally:
        if not committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def locked(lock_path: Path, shared: bool = False, wait: float | None = None) -> Iterator[None]:
    """Hold an flock on `lock_path` (created if needed) for the duration of the block.

    With `wait`, give up after that many seconds (Unavailable), and wait by polling with
    time.sleep: under gevent (serve's workers) a blocking flock would stop every greenlet
    of the worker, the one holding the lock included if it is in the same worker."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if wait is None:
            fcntl.flock(fd, mode)
        else:
            _flock_within(fd, mode, wait, lock_path)
        yield
    finally:
        os.close(fd)


def _flock_within(fd: int, mode: int, wait: float, lock_path: Path) -> None:
    deadline = time.monotonic() + wait
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"{lock_path} is held by another writer (waited "
                                  f"{wait:g} s): try again") from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)


def read_json(path: Path) -> dict:
    """The JSON object a file holds; {} if it is missing or not a JSON object (the writers
    above replace files whole, so a half-written one is never seen)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
