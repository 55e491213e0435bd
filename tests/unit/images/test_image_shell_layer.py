"""`write_layer`: an image shell's overlayfs upper dir as an OCI layer tarball; the
shell.json listing's rollback after a failed rebuild."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile

import pytest

from provisiond.errors import BuildFailed, ExitCode
from provisiond.images import shell
from provisiond.images.shell import write_layer
from provisiond.state.layout import Layout


def test_a_socket_left_by_the_session_is_skipped(tmp_path):
    """A daemon the session ran can leave a Unix socket behind (tar holds none; docker
    skips them too): it was an AttributeError traceback, the session's work lost."""
    upper = tmp_path / "upper"
    (upper / "run").mkdir(parents=True)
    (upper / "run/kept").write_text("x\n")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(upper / "run/daemon.sock"))
    listener.close()
    out = io.BytesIO()
    write_layer(upper, out)
    out.seek(0)
    with tarfile.open(fileobj=out) as layer:
        assert layer.getnames() == ["run", "run/kept"]


def listed(config, name: str) -> list[str]:
    path = Layout.of(config).image_shell_layers(name)
    return [e["path"] for e in json.loads(path.read_text())] if path.is_file() else []


def test_a_failed_rebuild_takes_only_its_own_entry_back_out(config, monkeypatch):
    """The rebuild failed after another entry was listed meanwhile (another process's
    edit): the rollback wrote back the listing as it was before this session, losing that
    entry; now it removes its own, read-modify-write under the listing's lock."""
    folder = Layout.of(config).image_shell_dir("img")
    folder.mkdir(parents=True)
    tar = folder / "mine.tar"
    tar.write_bytes(b"x")

    def failing_build(config, name, progress=None, lock_held=False):
        path = Layout.of(config).image_shell_layers(name)
        path.write_text(json.dumps([*json.loads(path.read_text()), {"path": "shell/other.tar"}]))
        raise BuildFailed("the rebuild failed")

    monkeypatch.setattr(shell, "build_image", failing_build)
    with pytest.raises(BuildFailed):
        shell._add_layer(config, "img", tar, "touch /x", None)
    assert listed(config, "img") == ["shell/other.tar"]
    assert not tar.exists()


def test_the_rollback_keeps_a_tarball_an_earlier_entry_lists(config, monkeypatch):
    """The same changes made twice give the same tarball: the first entry still needs it."""
    folder = Layout.of(config).image_shell_dir("img")
    folder.mkdir(parents=True)
    tar = folder / "same.tar"
    tar.write_bytes(b"x")
    Layout.of(config).image_shell_layers("img").write_text('[{"path": "shell/same.tar"}]')
    monkeypatch.setattr(shell, "build_image", lambda *a, **k: (_ for _ in ()).throw(
        BuildFailed("no")))
    with pytest.raises(BuildFailed):
        shell._add_layer(config, "img", tar, None, None)
    assert listed(config, "img") == ["shell/same.tar"] and tar.exists()


@pytest.mark.parametrize("name", ["../../../escaped", "a/b", "nothere"])
def test_a_bad_or_unknown_image_name_writes_nothing(cli, config, tmp_path, name):
    """The shell lock was taken before the name was checked: `image shell ../../x` made
    folders and a lock file outside the state dir (as root), `a/b` a folder under
    images/.locks, and an image never built left its lock file behind."""
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = cli("image", "shell", name, "--command", "true")
    assert result.code == (ExitCode.NOT_FOUND if name == "nothere"
                           else ExitCode.INVALID_INPUT), result
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_file_capabilities_and_user_xattrs_are_kept_in_the_layer(tmp_path):
    """`setcap cap_net_raw+ep /bin/ping` in the session (ping as a user) was lost: the
    tarball carried no xattrs. Now as PAX `SCHILY.xattr.NAME` records (docker's and GNU
    tar's), not overlayfs's own `trusted.overlay.*` bookkeeping."""
    upper = tmp_path / "upper"
    (upper / "bin").mkdir(parents=True)
    ping = upper / "bin/ping"
    ping.write_bytes(b"\x7fELF")
    capability = bytes.fromhex("0100000200200000000000000000000000000000")  # cap_net_raw+ep
    os.setxattr(ping, "security.capability", capability)
    os.setxattr(ping, "user.note", b"kept")
    os.setxattr(upper / "bin", "trusted.overlay.origin", b"\x00\xfb")
    out = io.BytesIO()
    write_layer(upper, out)
    out.seek(0)
    with tarfile.open(fileobj=out) as layer:
        members = {m.name: m for m in layer.getmembers()}
    xattrs = {key: value.encode("utf-8", "surrogateescape")
              for key, value in members["bin/ping"].pax_headers.items()
              if key.startswith("SCHILY.xattr.")}
    assert xattrs == {"SCHILY.xattr.security.capability": capability,
                      "SCHILY.xattr.user.note": b"kept"}
    assert not any(k.startswith("SCHILY.xattr.") for k in members["bin"].pax_headers)
