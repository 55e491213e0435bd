"""Blob store and compression: deterministic bytes, digests that name the content."""

from __future__ import annotations

import gzip
import hashlib

import pytest
import zstandard

from provisiond.errors import InvalidInput
from provisiond.images.blobs import blob_path, compressed, open_blob, store_file

DATA = b"layer data " * 50_000


def store(config, compression: str) -> str:
    with open_blob(config) as blob:
        with compressed(blob.hashing, compression) as stream:
            stream.write(DATA)
        return blob.commit()


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_compressed_blob_is_deterministic_and_named_by_its_sha256(config, compression):
    first, second = store(config, compression), store(config, compression)
    assert first == second
    raw = blob_path(config, first).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == first.split(":")[1]
    if compression == "zstd":
        assert zstandard.ZstdDecompressor().decompressobj().decompress(raw) == DATA
    else:
        assert gzip.decompress(raw) == DATA
    assert not [p for p in config.blob_dir.iterdir() if p.name.startswith(".incoming")]


def test_store_file_and_bad_digests(config, tmp_path):
    (tmp_path / "k").write_bytes(b"kernel")
    digest, size = store_file(config, tmp_path / "k")
    assert size == 6 and blob_path(config, digest).read_bytes() == b"kernel"
    for bad in ("sha256:../../etc/passwd", "md5:" + "0" * 32, "sha256:" + "G" * 64):
        with pytest.raises(InvalidInput):
            blob_path(config, bad)
    with pytest.raises(InvalidInput):
        store(config, "lz4")
