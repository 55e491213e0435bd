"""A small deterministic newc cpio writer working from memory, and the compressors.

Every entry is owned by root with mtime 0 and inode numbers in write order, so the same
entries always give the same bytes (and the same ETag). The images package has a writer of
its own (provisiond/images/cpio.py); the two should be merged into one module later.
"""

from __future__ import annotations

import gzip
import stat
from dataclasses import dataclass

import zstandard

from provisiond.errors import InvalidInput

TRAILER = "TRAILER!!!"
HEADER_FORMAT = "070701" + "%08X" * 13
ZSTD_LEVEL = 3
GZIP_LEVEL = 6
SUFFIXES = {"zstd": "zst", "gzip": "gz"}
# Symlinks to usr/... in merged-/usr images: a directory entry would replace the link.
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


def _header(ino: int, entry: Entry, name: bytes) -> bytes:
    fields = (ino, entry.mode, 0, 0, 2 if entry.is_dir else 1, 0, len(entry.data),
              0, 0, 0, 0, len(name) + 1, 0)
    return (HEADER_FORMAT % fields).encode()


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def pack(entries: list[Entry]) -> bytes:
    """A newc archive of `entries` in the order given, ended by the trailer."""
    parts: list[bytes] = []
    for ino, entry in enumerate([*entries, Entry(TRAILER, 0)], start=1):
        name = entry.path.encode()
        head = _header(0 if entry.path == TRAILER else ino, entry, name) + name + b"\0"
        parts += (head, _pad(len(head)), entry.data, _pad(len(entry.data)))
    return b"".join(parts)


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
    while chunk := reader.read(1 << 20):
        yield chunk


def unpack(data: bytes) -> list[Entry]:
    """Entries of an uncompressed newc archive (or several concatenated), trailers dropped."""
    entries, offset = [], 0
    while offset + 110 <= len(data):
        if data[offset:offset + 6] != b"070701":
            offset += 4 if data[offset:offset + 4] == b"\0\0\0\0" else 1
            continue
        fields = [int(data[offset + 6 + 8 * i:offset + 14 + 8 * i], 16) for i in range(13)]
        name_start = offset + 110
        name = data[name_start:name_start + fields[11] - 1].decode()
        data_start = name_start + fields[11] + _padlen(110 + fields[11])
        body = data[data_start:data_start + fields[6]]
        offset = data_start + fields[6] + _padlen(fields[6])
        if name != TRAILER:
            entries.append(Entry(name, fields[1], body))
    return entries


def _padlen(length: int) -> int:
    return -length % 4
