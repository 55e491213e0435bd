"""The newc writer: what the real cpio tool unpacks from it, and that it is deterministic."""

from __future__ import annotations

import io
import os
import subprocess
import time

import pytest

from provisiond.errors import ProvisiondError
from provisiond.images.cpio import MTIME_CLAMP, pack_tree


def make_tree(root):
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "bin").mkdir()
    (root / "bin/tool").write_bytes(b"\x7fELF" + bytes(range(256)) * 5)
    os.chmod(root / "bin/tool", 0o4755)
    os.symlink("tool", root / "bin/link")
    os.chown(root / "etc/passwd", 1234, 5678)
    os.mknod(root / "gone", 0o600 | 0o020000, os.makedev(0, 0))  # an overlayfs whiteout
    (root / "empty").mkdir()
    old = time.mktime((2020, 1, 1, 0, 0, 0, 0, 0, 0))
    os.utime(root / "bin/tool", (old, old))


def pack(root, **kwargs) -> bytes:
    out = io.BytesIO()
    pack_tree(root, out, **kwargs)
    return out.getvalue()


def test_real_cpio_unpacks_files_links_modes_owners(tmp_path):
    make_tree(tmp_path / "src")
    data = pack(tmp_path / "src", extra={".provisiond/whiteouts": b"/gone\n"})
    dest = tmp_path / "dest"
    dest.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=data, cwd=dest, check=True)
    assert (dest / "bin/tool").read_bytes() == (tmp_path / "src/bin/tool").read_bytes()
    assert (dest / "bin/tool").stat().st_mode & 0o7777 == 0o4755
    assert os.readlink(dest / "bin/link") == "tool"
    assert (dest / "etc/passwd").stat().st_uid == 1234
    assert (dest / "etc/passwd").stat().st_gid == 5678
    assert (dest / "empty").is_dir() and not (dest / "gone").exists()
    assert (dest / ".provisiond/whiteouts").read_text() == "/gone\n"
    assert (dest / "etc/passwd").stat().st_mtime == MTIME_CLAMP
    assert (dest / "bin/tool").stat().st_mtime < MTIME_CLAMP


def test_listing_is_sorted_parents_first(tmp_path):
    make_tree(tmp_path / "src")
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=pack(tmp_path / "src"),
                             capture_output=True, check=True).stdout.decode().split()
    assert listing == ["bin", "bin/link", "bin/tool", "empty", "etc", "etc/passwd"]


def test_same_tree_packs_to_same_bytes(tmp_path):
    make_tree(tmp_path / "a")
    make_tree(tmp_path / "b")
    os.utime(tmp_path / "b/etc/passwd", (time.time() + 5, time.time() + 5))
    assert pack(tmp_path / "a") == pack(tmp_path / "b")


def test_exclude_skips_a_path_and_its_children(tmp_path):
    make_tree(tmp_path / "src")
    data = pack(tmp_path / "src", exclude=lambda rel: rel == "bin")
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=data, capture_output=True,
                             check=True).stdout.decode().split()
    assert listing == ["empty", "etc", "etc/passwd"]


def test_mtime_before_1970_packs_as_zero(tmp_path):
    """newc has unsigned 8-digit mtimes: a negative one (possible in imported tarballs)
    was written as "-12CFF780", nine characters, and every later header was misread."""
    make_tree(tmp_path / "src")
    os.utime(tmp_path / "src/etc/passwd", (-315619200, -315619200))  # 1960
    dest = tmp_path / "dest"
    dest.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=pack(tmp_path / "src"), cwd=dest,
                   check=True)
    assert (dest / "etc/passwd").stat().st_mtime == 0


def test_file_of_4_gib_is_refused_in_one_line(tmp_path):
    """newc sizes are 8 hex digits: a larger file would corrupt every later header."""
    make_tree(tmp_path / "src")
    with open(tmp_path / "src/etc/huge", "wb") as handle:
        handle.truncate(1 << 32)  # sparse: no disk used
    with pytest.raises(ProvisiondError, match="etc/huge: .*4 GiB"):
        pack(tmp_path / "src")
