"""The overlay cpio writer: deterministic newc that the real cpio tool reads back."""

from __future__ import annotations

import subprocess

import pytest

from provisiond.overlays import cpio


def sample() -> list[cpio.Entry]:
    return cpio.with_parents([
        cpio.file_entry("etc/ssh/key", b"secret\n", 0o600),
        cpio.file_entry("usr/local/sbin/tool", b"#!/bin/sh\necho hi\n", 0o755),
        cpio.symlink_entry("etc/systemd/x.service", "/lib/systemd/system/x.service"),
        cpio.file_entry("bin/busybox-copy", b"not a dir entry for bin"),
    ], {"etc/ssh": 0o700})


def test_parents_first_and_merged_usr_links_left_alone():
    paths = [e.path for e in sample()]
    assert paths.index("etc") < paths.index("etc/ssh") < paths.index("etc/ssh/key")
    assert "bin" not in paths and "usr/local" in paths
    assert {e.path: e.mode for e in sample()}["etc/ssh"] == 0o40700


def test_pack_is_deterministic_and_round_trips():
    data = cpio.pack(sample())
    assert data == cpio.pack(sample())
    assert len(data) % 4 == 0 and data.endswith(b"\0") and b"TRAILER!!!" in data
    assert [(e.path, e.mode, e.data) for e in cpio.unpack(data)] == \
        [(e.path, e.mode, e.data) for e in sample()]


@pytest.mark.parametrize("method, magic", [("zstd", b"\x28\xb5\x2f\xfd"), ("gzip", b"\x1f\x8b")])
def test_compressed_members_concatenate(method, magic):
    one = cpio.compress(cpio.pack(sample()[:3]), method)
    two = cpio.compress(cpio.pack(sample()[3:]), method)
    assert one.startswith(magic) and cpio.compress(b"x", method) == cpio.compress(b"x", method)
    assert len(cpio.unpack(cpio.decompress(one + two))) == len(sample())


def test_real_cpio_tool_extracts_modes_and_links(tmp_path):
    archive = tmp_path / "a.cpio"
    archive.write_bytes(cpio.pack(sample()))
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet", "-F", str(archive)], cwd=out, check=True)
    assert (out / "etc/ssh/key").read_bytes() == b"secret\n"
    assert (out / "etc/ssh/key").stat().st_mode & 0o777 == 0o600
    assert (out / "etc/ssh").stat().st_mode & 0o777 == 0o700
    assert (out / "usr/local/sbin/tool").stat().st_mode & 0o777 == 0o755
    assert str((out / "etc/systemd/x.service").readlink()) == "/lib/systemd/system/x.service"


def test_unknown_compression():
    with pytest.raises(Exception, match="unknown compression"):
        cpio.compress(b"", "lz4")
