"""Per-node overlay builds under `overlay-builds/<node>/`, cached by the hash of their inputs.

`<kind>.cpio.<ext>` is the build and `<kind>.key` the hash it was built from; the key is
written after the build, so a crash between the two only causes a rebuild. Builds are
derived data and are not fsynced (that made 10,000 builds disk-bound); each file is still
replaced by rename, so readers see a whole old or a whole new build.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from provisiond.atomic import locked
from provisiond.config import Config
from provisiond.errors import NodeNotFound
from provisiond.overlays import cpio
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.render import Builder


def node_dir(config: Config, node: str) -> Path:
    return config.overlay_build_dir / node


def output_path(config: Config, builder: Builder, node: str, kind: str) -> Path:
    return node_dir(config, node) / f"{kind}.cpio.{cpio.SUFFIXES[builder.compression(kind)]}"


def _key_path(config: Config, node: str, kind: str) -> Path:
    return node_dir(config, node) / f"{kind}.key"


def _read_key(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_node(builder: Builder, node: str, kind: str, force: bool = False) -> bool:
    """Build the node's `kind` overlay if its inputs changed; True when it was rebuilt.

    A render error raises before anything is written: the previous build stays.
    """
    config = builder.config
    key = builder.node_key(node, kind)
    path = output_path(config, builder, node, kind)
    key_path = _key_path(config, node, kind)
    if not force and _read_key(key_path) == key and path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.parent / ".lock"):
        if not force and _read_key(key_path) == key and path.exists():
            return False
        data = builder.pack(node, kind)
        mode = 0o600 if kind == "runtime" else 0o644
        _replace(path, data, mode)
        _replace(key_path, key.encode())
    return True


def ensure_overlay(config: Config, node_name: str, kind: str) -> Path:
    """The node's current `kind` ("system" or "runtime") overlay, built if stale.

    Cheap when nothing changed: the inventory is re-read only when its file changed, and
    the cached build is returned after comparing one small key file.
    """
    snapshot = take_snapshot(config)
    if node_name not in snapshot.nodes:
        raise NodeNotFound(f"no node named {node_name!r}")
    builder = Builder(config, snapshot)
    build_node(builder, node_name, kind)
    return output_path(config, builder, node_name, kind)
