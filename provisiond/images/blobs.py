"""The content-addressed blob store: `blobs/sha256/<hex>`, written once, never changed."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import zstandard

from provisiond.archive import GZIP_LEVEL, ZSTD_LEVEL
from provisiond.config import Config
from provisiond.errors import InvalidInput, NotFound
from provisiond.state.layout import Layout


INCOMING = ".incoming."
"""The prefix of a blob's temp file while it is written (a build, a fetch from a peer)."""


class BlobNotFound(NotFound):
    """No blob has the given digest."""


def blob_path(config: Config, digest: str) -> Path:
    """Where the blob `sha256:<hex>` lives (whether or not it exists)."""
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64 or not all(
            c in "0123456789abcdef" for c in hexdigest):
        raise InvalidInput(f"not a blob digest: {digest!r}")
    return Layout.of(config).blob(hexdigest)


class _HashingFile:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, handle: BinaryIO):
        self.handle, self.sha, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


class BlobWriter:
    """Collects a blob in a temp file; `commit()` moves it to its digest's path."""

    def __init__(self, config: Config, hashing: _HashingFile, tmp: str):
        self.config, self.hashing, self.tmp = config, hashing, tmp
        self.digest = ""

    @property
    def size(self) -> int:
        return self.hashing.size

    def commit(self) -> str:
        self.hashing.handle.flush()
        os.fsync(self.hashing.handle.fileno())
        self.digest = "sha256:" + self.hashing.sha.hexdigest()
        os.chmod(self.tmp, 0o644)
        os.replace(self.tmp, blob_path(self.config, self.digest))
        return self.digest


@contextlib.contextmanager
def open_blob(config: Config) -> Iterator[BlobWriter]:
    """Yield a BlobWriter whose `hashing` file takes the raw bytes; commit inside the block."""
    folder = Layout.of(config).blobs
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=INCOMING, dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            writer = BlobWriter(config, _HashingFile(handle), tmp)
            yield writer
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def compressed(raw: BinaryIO, compression: str) -> Iterator[BinaryIO]:
    """A stream that compresses into `raw` deterministically, at archive's levels.

    Not archive.compress: layers are streamed (no content size in the zstd frame, two
    threads), and their digests must stay what they are."""
    if compression == "zstd":
        params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, threads=2)
        cctx = zstandard.ZstdCompressor(compression_params=params)
        with cctx.stream_writer(raw, closefd=False) as stream:
            yield stream
    elif compression == "gzip":
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                           compresslevel=GZIP_LEVEL) as stream:
            yield stream
    else:
        raise InvalidInput(f"unknown compression {compression!r} (use zstd or gzip)")


def store_file(config: Config, path: Path) -> tuple[str, int]:
    """Copy a file into the store as is (unless already there); returns (digest, size)."""
    digest = "sha256:" + file_sha256(path)
    if blob_path(config, digest).is_file():
        return digest, path.stat().st_size
    with open_blob(config) as blob, open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            blob.hashing.write(chunk)
        return blob.commit(), blob.size


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return stream_sha256(handle)


def stream_sha256(handle) -> str:
    """Hex sha256 of what a binary file object holds from its position on, 1 MiB at a time."""
    sha = hashlib.sha256()
    while chunk := handle.read(1 << 20):
        sha.update(chunk)
    return sha.hexdigest()
