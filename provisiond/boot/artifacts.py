"""Read what the image and overlay builders produced, following docs/contracts.md.

Manifests are cached until their file changes; overlays are built on demand when stale.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import ImageNotFound, InvalidInput, NotFound
from provisiond.images import load_manifest
from provisiond.overlays import ensure_overlay

HEX_RE = re.compile(r"[0-9a-f]{64}")


class OverlayUnavailable(NotFound):
    """The node's overlay cannot be built or is not there."""


class LruCache:
    """At most `size` entries; a new one beyond that drops the least recently used. For
    what a server keeps per node or per file: its memory stays bounded however many
    nodes boot (greenlets and the GIL make each call atomic enough here)."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        value = self._data.get(key, default)
        if key in self._data:
            self._data.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def pop(self, key) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class ManifestCache:
    """Image manifests by name, re-read only when manifest.json changes; a name is stat'ed
    at most once per `interval` seconds (no syscall on most requests)."""

    def __init__(self, config: Config, interval: float = 1.0, size: int = 256):
        self.config = config
        self.interval = interval
        self._cache = LruCache(size)  # name -> (stat stamp, manifest, checked at)

    def get(self, name: str) -> dict:
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached and now - cached[2] < self.interval:
            return cached[1]
        return self._load(name, cached, now)

    def _load(self, name: str, cached: tuple | None, now: float) -> dict:
        path = self.config.images_dir / name / "manifest.json"
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_ino, st.st_size)  # a rename within a tick: new inode
        except (FileNotFoundError, NotADirectoryError):
            self._cache.pop(name)
            raise ImageNotFound(f"no image named {name!r} has been built") from None
        manifest = cached[1] if cached and cached[0] == stamp else load_manifest(self.config,
                                                                                 name)
        self._cache.put(name, (stamp, manifest, now))
        return manifest


def blob_file(config: Config, hexdigest: str) -> Path:
    """The blob `sha256:<hexdigest>`; a malformed digest is InvalidInput."""
    if not HEX_RE.fullmatch(hexdigest):  # `match` + `$` let a trailing newline in
        raise InvalidInput("a blob is named by 64 lowercase hex digits")
    return config.blob_dir / hexdigest


def overlay_file(config: Config, node: str, kind: str) -> Path:
    """The node's built overlay (built first if stale) from provisiond.overlays."""
    path = Path(ensure_overlay(config, node, kind))
    if not path.is_file():
        raise OverlayUnavailable(f"no {kind} overlay built for {node}")
    return path

