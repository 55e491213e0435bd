"""What makes two builds of the same packages give the same layer: SOURCE_DATE_EPOCH as the
mtime clamp (and in the cache key), and drop_volatile's removal of logs, caches and ids."""

from __future__ import annotations

import io
import os
import subprocess

import pytest

from provisiond.errors import InvalidInput
from provisiond.images.cpio import MTIME_CLAMP, pack_tree, source_date_epoch
from provisiond.images.layers import layer_key
from provisiond.images.steps import drop_volatile


def test_source_date_epoch_clamps_mtimes_and_changes_the_key(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/new").write_text("x\n")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    default_key = layer_key(None, "run", {}, {}, "zstd")
    assert source_date_epoch() == MTIME_CLAMP
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    out = io.BytesIO()
    pack_tree(tmp_path / "src", out, mtime=source_date_epoch())
    dest = tmp_path / "dest"
    dest.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=out.getvalue(), cwd=dest, check=True)
    assert (dest / "new").stat().st_mtime == 1700000000
    assert layer_key(None, "run", {}, {}, "zstd") != default_key


@pytest.mark.parametrize("value", ["yesterday", "-1", "99999999999"])
def test_a_bad_source_date_epoch_is_one_clear_error(monkeypatch, value):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(InvalidInput, match="SOURCE_DATE_EPOCH=.*not seconds since 1970"):
        source_date_epoch()


def test_drop_volatile_removes_logs_caches_and_ids_and_keeps_the_rest(tmp_path):
    upper = tmp_path / "upper"
    files = {"var/log/alternatives.log": "update-alternatives 2026-11-22 21:40\n",
             "var/log/apt/history.log": "Start-Date: 2026-11-22\n",
             "var/cache/ldconfig/aux-cache": "\x00aux",
             "var/lib/dpkg/status-old": "Package: x\n",
             "var/lib/dpkg/status": "Package: x\n",
             "var/lib/apt/lists/deb.debian.org_InRelease": "x",
             "etc/machine-id": "0123456789abcdef0123456789abcdef\n",
             "etc/keep.conf": "kept\n"}
    for rel, text in files.items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_text(text)
    os.mknod(upper / "var/log/gone.log", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    os.symlink("/etc/machine-id", upper / "var/lib/dbus-link")
    drop_volatile(upper)
    left = sorted(str(p.relative_to(upper)) for p in upper.rglob("*")
                  if p.is_file() or p.is_symlink())
    assert left == ["etc/keep.conf", "etc/machine-id", "var/lib/dbus-link",
                    "var/lib/dpkg/status"]
    assert (upper / "etc/machine-id").read_text() == ""
    assert (upper / "var/log/apt").is_dir() and (upper / "var/lib/apt/lists").is_dir()
    assert os.path.exists(upper / "var/log/gone.log")  # the whiteout stays a deletion
