"""A deterministic, streaming newc cpio writer for layer trees.

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

MTIME_CLAMP = 1767225600  # 2026-01-01T00:00:00Z: newer mtimes are clamped to it
CHUNK = 1 << 20
TRAILER = "TRAILER!!!"


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


class CpioWriter:
    """Writes newc entries to a binary stream; call close() to add the trailer."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.ino = 0

    def _header(self, name: str, mode: int, uid: int, gid: int, mtime: int,
                size: int, rdev: int = 0, nlink: int = 1) -> None:
        self.ino += 1
        encoded = name.encode("utf-8", "surrogateescape") + b"\0"
        fields = (self.ino, mode, uid, gid, nlink, min(int(mtime), MTIME_CLAMP), size,
                  0, 0, os.major(rdev), os.minor(rdev), len(encoded), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.out.write(header + encoded + b"\0" * (-(len(header) + len(encoded)) % 4))

    def add_bytes(self, name: str, data: bytes, mode: int = 0o100644) -> None:
        self._header(name, mode, 0, 0, MTIME_CLAMP, len(data))
        self.out.write(data + b"\0" * (-len(data) % 4))

    def add_dir(self, name: str, mode: int = 0o40755) -> None:
        self._header(name, mode, 0, 0, MTIME_CLAMP, 0, nlink=2)

    def add_path(self, name: str, path: Path, st: os.stat_result) -> None:
        """Add one filesystem entry (file, dir, symlink, device, fifo) as `name`."""
        mode = st.st_mode
        if stat.S_ISREG(mode):
            self._header(name, mode, st.st_uid, st.st_gid, st.st_mtime, st.st_size)
            self._copy_file(path, st.st_size)
        elif stat.S_ISLNK(mode):
            target = os.fsencode(os.readlink(path))
            self._header(name, mode, st.st_uid, st.st_gid, st.st_mtime, len(target))
            self.out.write(target + b"\0" * (-len(target) % 4))
        elif stat.S_ISDIR(mode):
            self._header(name, mode, st.st_uid, st.st_gid, st.st_mtime, 0, nlink=2)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
            self._header(name, mode, st.st_uid, st.st_gid, st.st_mtime, 0, rdev=st.st_rdev)
        # sockets are skipped: they mean nothing in an image

    def _copy_file(self, path: Path, size: int) -> None:
        written = 0
        with open(path, "rb") as handle:
            while written < size:
                chunk = handle.read(min(CHUNK, size - written))
                if not chunk:
                    raise OSError(f"{path} shrank while packing")
                self.out.write(chunk)
                written += len(chunk)
        self.out.write(b"\0" * (-size % 4))

    def close(self) -> None:
        self._header(TRAILER, 0, 0, 0, 0, 0, nlink=1)
        self.ino = 0


def pack_tree(root: Path, out: BinaryIO, extra: dict[str, bytes] | None = None,
              exclude: Callable[[str], bool] = lambda rel: False) -> int:
    """Pack a layer tree (skipping whiteouts and excluded paths) plus `extra` files.

    `extra` maps paths such as ".provisiond/whiteouts" to contents; their parent dirs are
    added if the tree lacks them. Returns the number of entries written.
    """
    writer, count = CpioWriter(out), 0
    extra = dict(extra or {})
    extra_dirs = sorted({os.path.dirname(p) for p in extra if os.path.dirname(p)})
    for rel, st in walk_tree(root, exclude):
        if is_whiteout(st):
            continue
        writer.add_path(rel, root / rel, st)
        count += 1
        if rel in extra_dirs:
            extra_dirs.remove(rel)
    for rel in extra_dirs:
        writer.add_dir(rel)
    for rel in sorted(extra):
        writer.add_bytes(rel, extra[rel])
    writer.close()
    return count + len(extra_dirs) + len(extra)
