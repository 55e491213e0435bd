"""provisiond.archive as the overlays use it: deterministic newc that the real cpio tool
reads back, with the bytes it has always had (builds and ETags must not change)."""

from __future__ import annotations

import hashlib
import io
import subprocess

import pytest

from provisiond import archive


def sample() -> list[archive.Entry]:
    return archive.with_parents([
        archive.file_entry("etc/ssh/key", b"secret\n", 0o600),
        archive.file_entry("usr/local/sbin/tool", b"#!/bin/sh\necho hi\n", 0o755),
        archive.symlink_entry("etc/systemd/x.service", "/lib/systemd/system/x.service"),
        archive.file_entry("bin/busybox-copy", b"not a dir entry for bin"),
    ], {"etc/ssh": 0o700})


def test_parents_first_and_merged_usr_links_left_alone():
    paths = [e.path for e in sample()]
    assert paths.index("etc") < paths.index("etc/ssh") < paths.index("etc/ssh/key")
    assert "bin" not in paths and "usr/local" in paths
    assert {e.path: e.mode for e in sample()}["etc/ssh"] == 0o40700


def test_pack_is_deterministic_and_round_trips():
    data = archive.pack(sample())
    assert data == archive.pack(sample())
    assert len(data) % 4 == 0 and data.endswith(b"\0") and b"TRAILER!!!" in data
    assert [(e.path, e.mode, e.data) for e in archive.unpack(data)] == \
        [(e.path, e.mode, e.data) for e in sample()]


@pytest.mark.parametrize("method, magic", [("zstd", b"\x28\xb5\x2f\xfd"), ("gzip", b"\x1f\x8b")])
def test_compressed_members_concatenate(method, magic):
    one = archive.compress(archive.pack(sample()[:3]), method)
    two = archive.compress(archive.pack(sample()[3:]), method)
    assert one.startswith(magic) and archive.compress(b"x", method) == archive.compress(b"x", method)
    assert len(archive.unpack(archive.decompress(one + two))) == len(sample())


def test_real_cpio_tool_extracts_modes_and_links(tmp_path):
    packed = tmp_path / "a.cpio"
    packed.write_bytes(archive.pack(sample()))
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet", "-F", str(packed)], cwd=out, check=True)
    assert (out / "etc/ssh/key").read_bytes() == b"secret\n"
    assert (out / "etc/ssh/key").stat().st_mode & 0o777 == 0o600
    assert (out / "etc/ssh").stat().st_mode & 0o777 == 0o700
    assert (out / "usr/local/sbin/tool").stat().st_mode & 0o777 == 0o755
    assert str((out / "etc/systemd/x.service").readlink()) == "/lib/systemd/system/x.service"


def test_unknown_compression():
    with pytest.raises(Exception, match="unknown compression"):
        archive.compress(b"", "lz4")


def test_bytes_are_pinned():
    """The digests the overlay writer gave before it became provisiond.archive."""
    entries = archive.with_parents([
        archive.file_entry("etc/a/b", b"hello", 0o600), archive.symlink_entry("usr/x", "/y"),
        archive.dir_entry("var/z", 0o700), archive.file_entry("init", b"#!/bin/sh\n", 0o755)])
    raw = archive.pack(entries)
    assert hashlib.sha256(raw).hexdigest().startswith("40b1880a6b53c542")
    assert hashlib.sha256(archive.pack([])).hexdigest().startswith("5096c083e1a504be")
    assert hashlib.sha256(archive.compress(raw, "gzip")).hexdigest().startswith("c55e37a76564")


def test_writer_numbered_trailer_and_mtime_clamp():
    out = io.BytesIO()
    writer = archive.Writer(out, mtime=1000)
    writer.add(archive.file_entry("a", b"x"))
    writer.close(numbered=True)
    head = out.getvalue()
    assert head[6:14] == b"00000001" and head[46:54] == b"%08X" % 1000
    trailer = head.rindex(b"070701")
    assert head[trailer + 6:trailer + 14] == b"00000002"  # the layers' format
    assert archive.pack([])[6:14] == b"00000000"  # the overlays' format


COPIES = ".provisiond/overlays"


def test_pack_with_copies_holds_each_entry_twice_and_a_file_s_data_once():
    data = archive.pack_with_copies(sample(), COPIES)
    assert data.count(b"secret\n") == 1 and data.count(b"#!/bin/sh\necho hi\n") == 1
    found = {e.path: (e.mode, e.data) for e in archive.unpack(data)}
    for e in sample():
        assert found[e.path] == found[f"{COPIES}/{e.path}"] == (e.mode, e.data)
    # the copies get the merged-/usr parent with_parents leaves out (the kernel creates no
    # missing parent); in place there is still none, to leave an image's /bin link alone
    assert found[f"{COPIES}/bin"][0] == 0o40755 and "bin" not in found
    paths = [e.path for e in archive.unpack(data)]
    assert paths.index(f"{COPIES}/etc/ssh/key") < paths.index("etc/ssh/key")  # copy first
    assert archive.pack_with_copies([], COPIES) == archive.pack([])


def test_pack_with_copies_leaves_a_top_level_merged_usr_dir_out_of_place():
    entries = [archive.dir_entry("lib", 0o700), archive.file_entry("lib/x", b"x")]
    found = {e.path: e.mode for e in archive.unpack(archive.pack_with_copies(entries, COPIES))}
    assert "lib" not in found and found[f"{COPIES}/lib"] == 0o40700 and "lib/x" in found


def test_real_cpio_tool_extracts_the_copies_as_hard_links(tmp_path):
    packed = tmp_path / "a.cpio"
    packed.write_bytes(archive.pack_with_copies(sample(), COPIES))
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet", "-F", str(packed)], cwd=out, check=True)
    placed, copy = out / "etc/ssh/key", out / COPIES / "etc/ssh/key"
    assert placed.read_bytes() == b"secret\n" and placed.stat().st_mode & 0o777 == 0o600
    assert placed.stat().st_ino == copy.stat().st_ino and placed.stat().st_nlink == 2
    assert str((out / COPIES / "etc/systemd/x.service").readlink()) == \
        "/lib/systemd/system/x.service"


def test_unpack_gives_every_name_of_a_hard_link_its_data_archive_by_archive():
    """Inode numbers restart in each archive of a concatenation: a link of the second is
    not the first's file of that number."""
    one = archive.pack_with_copies([archive.file_entry("a", b"first")], COPIES)
    two = archive.pack_with_copies([archive.file_entry("b", b"second")], COPIES)
    found = {e.path: e.data for e in archive.unpack(one + two)}
    assert (found["a"], found["b"], found[f"{COPIES}/b"]) == (b"first", b"second", b"second")
