"""Pack layer trees as deterministic newc archives (the writer is provisiond.archive).

Entries come out sorted (parents first), inode numbers are sequential, mtimes are clamped
to a fixed epoch and owners and modes are kept, so the same tree always packs to the same
bytes. Overlayfs whiteouts (0/0 character devices) are left out: they become the image's
whiteout list instead.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from provisiond.archive import Writer, dir_entry, file_entry
from provisiond.errors import InvalidInput

MTIME_CLAMP = 1767225600  # 2026-01-01T00:00:00Z: newer mtimes are clamped to it
EPOCH_ENV = "SOURCE_DATE_EPOCH"


def source_date_epoch() -> int:
    """The mtime clamp: SOURCE_DATE_EPOCH (reproducible-builds.org) when set, else
    MTIME_CLAMP. Files a build makes get the clamp only if the clock is past it."""
    text = os.environ.get(EPOCH_ENV)
    if text is None:
        return MTIME_CLAMP
    if not text.isdigit() or not 0 <= int(text) <= 0xFFFFFFFF:
        raise InvalidInput(f"{EPOCH_ENV}={text[:40]!r}: not seconds since 1970 "
                           "(0 to 4294967295, as a newc archive holds them)")
    return int(text)


def is_whiteout(st: os.stat_result) -> bool:
    """Overlayfs marks a deleted path in the upper dir with a 0/0 character device."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def walk_tree(root: Path, skip: Callable[[str], bool] = lambda rel: False, _rel: str = ""
              ) -> Iterator[tuple[str, os.stat_result]]:
    """Yield (relative path, lstat) for every entry under root: sorted, depth first,
    each directory before its contents. A skipped directory is skipped whole."""
    with os.scandir(root / _rel if _rel else root) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        rel = f"{_rel}/{name}" if _rel else name
        if skip(rel):
            continue
        st = os.lstat(root / rel)
        yield rel, st
        if stat.S_ISDIR(st.st_mode):
            yield from walk_tree(root, skip, rel)


def pack_tree(root: Path, out: BinaryIO, extra: dict[str, bytes] | None = None,
              exclude: Callable[[str], bool] = lambda rel: False,
              mtime: int = MTIME_CLAMP, copies: dict[str, str] | None = None) -> int:
    """Pack a layer tree (skipping whiteouts and excluded paths) plus `extra` files.

    `extra` maps paths such as ".provisiond/whiteouts" to contents; `copies` maps more
    paths to entries of the tree packed again under them; the parent dirs of both are
    added if the tree lacks them. Returns the number of entries written.
    """
    writer, count = Writer(out, mtime=mtime), 0
    extra, copies = dict(extra or {}), dict(copies or {})
    dirs = _parents([*extra, *copies])
    for rel, st in walk_tree(root, exclude):
        if is_whiteout(st):
            continue
        writer.add_path(rel, root / rel, st)
        count += 1
        dirs.discard(rel)
    for rel in sorted(dirs):
        writer.add(dir_entry(rel))
    for rel in sorted(copies):
        writer.add_path(rel, root / copies[rel], os.lstat(root / copies[rel]))
    for rel in sorted(extra):
        writer.add(file_entry(rel, extra[rel]))
    writer.close(numbered=True)
    return count + len(dirs) + len(copies) + len(extra)


def _parents(paths: list[str]) -> set[str]:
    """Every parent directory of these relative paths ("a/b/c": "a" and "a/b")."""
    parts = (path.split("/") for path in paths)
    return {"/".join(p[:i]) for p in parts for i in range(1, len(p))}
