"""Deterministic newc (cpio) archives and their compression, for image layers and overlays.

Inode numbers follow write order, device numbers of the archive are 0, and owners and
mtimes are the caller's (0 for in-memory entries unless the writer says otherwise), so the
same entries always give the same bytes (and the same digest or ETag).
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import zstandard

from provisiond.errors import InvalidInput

TRAILER = "TRAILER!!!"
MAGIC = b"070701"
HEADER = MAGIC + b"%08X" * 13  # one format for the 13 fields (a join of 13 was 2x slower)
CHUNK = 1 << 20
ZSTD_LEVEL = 3
GZIP_LEVEL = 6
SUFFIXES = {"zstd": "zst", "gzip": "gz"}
# Symlinks to usr/... in merged-/usr images: a directory entry would replace the link.
# tarfile.extract(..., **TRUSTED): members extracted as they are (we choose them ourselves).
# The filter argument arrived in 3.11.4; Debian 12's python3 is 3.11.2 and has none, and
# there extract already behaves as "fully_trusted".
TRUSTED = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}

MERGED_USR_LINKS = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32"})


@dataclass(frozen=True)
class Entry:
    """One archive member: `mode` holds the type bits; a symlink's data is its target."""

    path: str
    mode: int
    data: bytes = b""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def file_entry(path: str, data: bytes, perm: int = 0o644) -> Entry:
    return Entry(path, stat.S_IFREG | perm, data)


def dir_entry(path: str, perm: int = 0o755) -> Entry:
    return Entry(path, stat.S_IFDIR | perm)


def symlink_entry(path: str, target: str) -> Entry:
    return Entry(path, stat.S_IFLNK | 0o777, target.encode())


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


class Writer:
    """Writes newc entries to a binary stream in the order given; close() adds the trailer.

    `mtime` is the mtime of in-memory entries and the latest one kept from files."""

    def __init__(self, out: BinaryIO, mtime: int = 0):
        self.out = out
        self.mtime = mtime
        self.ino = 0

    def header(self, name: str, mode: int, size: int, uid: int = 0, gid: int = 0,
               mtime: float = 0, rdev: int = 0, ino: int | None = None,
               nlink: int | None = None) -> None:
        """One header and name; the next inode number unless `ino` is given. The mtime is
        clamped to [0, self.mtime]: newc fields are unsigned 8-digit hex."""
        if size > 0xFFFFFFFF:
            raise InvalidInput(f"{name}: a newc archive cannot hold a file of 4 GiB or more")
        if ino is None:
            self.ino += 1
            ino = self.ino
        encoded = name.encode("utf-8", "surrogateescape") + b"\0"
        if nlink is None:
            nlink = 2 if stat.S_ISDIR(mode) else 1
        major, minor = (os.major(rdev), os.minor(rdev)) if rdev else (0, 0)
        head = HEADER % (ino, mode, uid, gid, nlink, max(0, min(int(mtime), self.mtime)),
                         size, 0, 0, major, minor, len(encoded), 0)
        self.out.write(head + encoded + _pad(len(head) + len(encoded)))

    def add(self, entry: Entry) -> None:
        self.header(entry.path, entry.mode, len(entry.data), mtime=self.mtime)
        self.out.write(entry.data + _pad(len(entry.data)))

    def add_twice(self, entry: Entry, first: str) -> None:
        """`entry` named `first`, then under its own path: a file the second time as a hard
        link (newc: one inode, nlink 2 in both headers, the data with the first only),
        anything else written again (a symlink's target is its data)."""
        mode, data = entry.mode, entry.data
        regular = stat.S_ISREG(mode)
        self.header(first, mode, len(data), mtime=self.mtime, nlink=2 if regular else None)
        self.out.write(data + _pad(len(data)))
        if regular:
            self.header(entry.path, mode, 0, mtime=self.mtime, ino=self.ino, nlink=2)
        else:
            self.add(entry)

    def add_path(self, name: str, path: Path, st: os.stat_result) -> None:
        """One file system entry (file, dir, symlink, device, fifo) as `name`, with its
        owner and (clamped) mtime; sockets are skipped."""
        mode, owner = st.st_mode, {"uid": st.st_uid, "gid": st.st_gid, "mtime": st.st_mtime}
        if stat.S_ISREG(mode):
            self.header(name, mode, st.st_size, **owner)
            self._copy_file(path, st.st_size)
        elif stat.S_ISLNK(mode):
            target = os.fsencode(os.readlink(path))
            self.header(name, mode, len(target), **owner)
            self.out.write(target + _pad(len(target)))
        elif stat.S_ISDIR(mode):
            self.header(name, mode, 0, **owner)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
            self.header(name, mode, 0, rdev=st.st_rdev, **owner)

    def _copy_file(self, path: Path, size: int) -> None:
        written = 0
        with open(path, "rb") as handle:
            while written < size:
                chunk = handle.read(min(CHUNK, size - written))
                if not chunk:
                    raise OSError(f"{path} shrank while packing")
                self.out.write(chunk)
                written += len(chunk)
        self.out.write(_pad(size))

    def close(self, numbered: bool = False) -> None:
        """The trailer: inode 0, or with `numbered` the next number (image layers were
        first made so, and their digests must not change)."""
        self.header(TRAILER, 0, 0, ino=self.ino + 1 if numbered else 0)
        self.ino = 0


def pack(entries: list[Entry]) -> bytes:
    """A newc archive of `entries` in the order given, ended by the trailer."""
    out = io.BytesIO()
    writer = Writer(out)
    for entry in entries:
        writer.add(entry)
    writer.close()
    return out.getvalue()


def pack_with_copies(entries: list[Entry], folder: str) -> bytes:
    """A newc archive of `entries` (parents first) where each is written twice: under
    `folder` first, then in place, a file in place being a hard link to its copy (its data
    once). The kernel writes the copies whatever the image holds; in place it cannot put an
    entry of another type over a directory with files (it removes those with rmdir), and
    a top-level merged-/usr directory is left out (the entry would replace the image's
    link: the files go where the link leads)."""
    if not entries:
        return pack([])
    out = io.BytesIO()
    writer = Writer(out)
    parts = folder.split("/")
    dirs = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    # a merged-/usr parent with_parents left out: the copies need it
    tops = {entry.path.split("/")[0] for entry in entries} & MERGED_USR_LINKS
    dirs += [f"{folder}/{top}" for top in sorted(tops - {entry.path for entry in entries})]
    for path in dirs:
        writer.add(dir_entry(path))
    for entry in entries:
        if entry.is_dir and entry.path in MERGED_USR_LINKS:
            writer.add(Entry(f"{folder}/{entry.path}", entry.mode))
        else:
            writer.add_twice(entry, f"{folder}/{entry.path}")
    writer.close()
    return out.getvalue()


def with_parents(entries: list[Entry], dir_modes: dict[str, int] | None = None) -> list[Entry]:
    """Entries with a directory entry for every parent, parents first, later paths winning.

    The kernel and cpio create no missing parents, so each one must be in the archive,
    except the top-level dirs that merged-/usr images hold as symlinks (they always exist).
    """
    dir_modes = dir_modes or {}
    by_path = {e.path: e for e in entries}
    for path in list(by_path):
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/".join(parts[:depth])
            if parent not in by_path and parent not in MERGED_USR_LINKS:
                by_path[parent] = dir_entry(parent, dir_modes.get(parent, 0o755))
    return [by_path[p] for p in sorted(by_path, key=lambda p: (p.count("/"), p))]


def compress(data: bytes, method: str) -> bytes:
    """`data` compressed as the kernel and the node agent can unpack it (no timestamps)."""
    if method == "zstd":
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    if method == "gzip":
        return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    raise InvalidInput(f"unknown compression {method!r}: use zstd or gzip")


def decompress(data: bytes) -> bytes:
    """The inverse of compress, for any concatenation of zstd or gzip members."""
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return b"".join(_zstd_frames(data))
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    return data


def _zstd_frames(data: bytes):
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    while chunk := reader.read(CHUNK):
        yield chunk


def unpack(data: bytes) -> list[Entry]:
    """Entries of an uncompressed newc archive (or several concatenated), trailers dropped;
    a hard-linked file's names all carry its data (written with one of them)."""
    entries, offset, linked = [], 0, {}
    while offset + 110 <= len(data):
        if data[offset:offset + 6] != MAGIC:
            offset += 4 if data[offset:offset + 4] == b"\0\0\0\0" else 1
            continue
        fields = [int(data[offset + 6 + 8 * i:offset + 14 + 8 * i], 16) for i in range(13)]
        name_start = offset + 110
        name = data[name_start:name_start + fields[11] - 1].decode()
        data_start = name_start + fields[11] + -(110 + fields[11]) % 4
        body = data[data_start:data_start + fields[6]]
        offset = data_start + fields[6] + -fields[6] % 4
        if name == TRAILER:
            linked = {}  # inode numbers are the archive's own
        elif stat.S_ISREG(fields[1]) and fields[4] > 1:  # one inode, its data written once
            names = linked.setdefault(fields[0], [])
            names.append(len(entries))
            entries.append(Entry(name, fields[1], body))
            body = body or entries[names[0]].data
            for index in names:
                entries[index] = replace(entries[index], data=body)
        else:
            entries.append(Entry(name, fields[1], body))
    return entries
