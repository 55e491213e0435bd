"""Overlay builds, cached by the hash of their inputs: `overlay-builds/<node>/<kind>.cpio.<ext>`
(system, runtime) per node, and `overlay-builds/_shared/<key>.cpio.<ext>` once per content.

A shared build is named by its key, so it is current when it exists. A node's build has the
hash it was built from as its `user.provisiond.key` xattr, set before the file is renamed
into place (or, where the file system has no user xattrs, a `<kind>.key` file written after
it: a crash between the two only causes a rebuild). Builds are derived data and are not
fsynced (that made 10,000 builds disk-bound); each file is still replaced by rename, so
readers see a whole old or a whole new build."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

from provisiond import archive
from provisiond.config import Config
from provisiond.errors import BuildFailed, NodeNotFound, ProvisiondError
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.render import Builder
from provisiond.state.layout import SHARED_BUILDS, Layout

KEY_XATTR = "user.provisiond.key"


def node_dir(config: Config, node: str) -> Path:
    return Layout.of(config).overlay_node_dir(node)


def shared_dir(config: Config) -> Path:
    return Layout.of(config).overlay_shared_dir


def output_path(config: Config, builder: Builder, node: str, kind: str) -> Path:
    return Path(_output_name(builder, node, kind))


def _output_name(builder: Builder, node: str, kind: str) -> str:
    """The build's path as a string (no pathlib: checked for every node of a build)."""
    suffix = archive.SUFFIXES[builder.compression(kind)]
    if kind == "shared":
        return f"{builder.build_dir}/{SHARED_BUILDS}/{builder.node_key(node, kind)}.cpio.{suffix}"
    return f"{builder.build_dir}/{node}/{kind}.cpio.{suffix}"


def _key_file(path: str) -> str:
    """The `<kind>.key` beside the build `<kind>.cpio.<ext>`."""
    folder, name = os.path.split(path)
    return os.path.join(folder, name.split(".", 1)[0] + ".key")


def _read_key(path: str) -> str | None:
    """The key the build at `path` was made from: its xattr, else the `.key` file."""
    try:
        return os.getxattr(path, KEY_XATTR).decode()
    except FileNotFoundError:
        return None
    except OSError:
        pass  # no xattr (an older build, or a file system without user xattrs)
    try:
        return Path(_key_file(path)).read_text() if os.path.exists(path) else None
    except FileNotFoundError:
        return None


def _replace(path: Path, data: bytes, mode: int, key: str) -> None:
    """Write a temp file, tag it with its key and rename it over `path` (no fsync: builds
    can always be rebuilt). Without user xattrs the key goes to `<kind>.key` afterwards."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    tagged = True
    try:
        if mode != 0o600:  # mkstemp made it 0600 (one metadata write fewer per build)
            os.fchmod(fd, mode)
        try:
            os.setxattr(fd, KEY_XATTR, key.encode())
        except OSError:
            tagged = False
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not tagged and path.parent.name != SHARED_BUILDS:
        Path(_key_file(str(path))).write_text(key)


@contextlib.contextmanager
def _locked_dir(folder: Path):
    """An exclusive flock on the build directory itself (no lock file to create)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _is_current(path: str, kind: str, key: str) -> bool:
    if kind == "shared":
        return os.path.exists(path)  # named by its key
    return _read_key(path) == key


def is_built(builder: Builder, node: str, kind: str) -> bool:
    """Whether the node's build is current; cheap, and never generates secrets."""
    try:
        if not builder.secrets_exist(node, kind):
            return False
        key = builder.node_key(node, kind)
    except ProvisiondError:
        return False  # building it will report the error
    return _is_current(_output_name(builder, node, kind), kind, key)


def build_node(builder: Builder, node: str, kind: str, force: bool = False) -> bool:
    """Build the node's `kind` overlay if its inputs changed; True when it was rebuilt.

    A render error raises before anything is written: the previous build stays. The key
    file is written in place after the build is renamed in: a torn key only means a rebuild.
    """
    config = builder.config
    builder.make_secrets(node, kind)
    key = builder.node_key(node, kind)
    path = output_path(config, builder, node, kind)
    if not force and _is_current(str(path), kind, key):
        return False
    try:
        return _write_build(builder, node, kind, path, key, force)
    except OSError as exc:  # a full disk fails this node's build, not the whole batch
        raise BuildFailed(f"overlay build of {node} ({kind}): {exc.strerror or exc}") from None


def _write_build(builder: Builder, node: str, kind: str, path: Path, key: str,
                 force: bool) -> bool:
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
    with _locked_dir(path.parent):  # a concurrent builder of the same key writes the same
        if kind == "shared" and not force and path.exists():
            return False  # another process built it while we waited for the lock
        data = builder.pack(node, kind)
        _replace(path, data, 0o600 if kind == "runtime" else 0o644, key)
    return True


def ensure_overlay(config: Config, node_name: str, kind: str) -> Path:
    """The node's current `kind` overlay, built if stale: "shared" (its node-independent
    system overlays), "system" (the node-specific ones) or "runtime".

    Cheap when nothing changed: the inventory is re-read only when its file changed, and
    the cached build is returned after comparing one small key file.
    """
    snapshot = take_snapshot(config)
    if node_name not in snapshot.nodes:
        raise NodeNotFound(f"no node named {node_name!r}")
    builder = Builder(config, snapshot)
    build_node(builder, node_name, kind)
    return output_path(config, builder, node_name, kind)


def remove_unused_shared(config: Config, keep: set[Path]) -> int:
    """Delete shared builds not in `keep` (after a full build); returns how many.

    A reader that has the file open keeps reading it; one that resolved the path just
    before the inventory changed gets a 404 and the node's iPXE script retries."""
    removed = 0
    folder = shared_dir(config)
    if not folder.is_dir():
        return 0
    with _locked_dir(folder):  # no build renames a file in meanwhile
        for path in folder.iterdir():
            if path not in keep and not path.name.startswith("."):
                path.unlink(missing_ok=True)
                removed += 1
    return removed
