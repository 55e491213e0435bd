"""Read what the image and overlay builders produced, following docs/contracts.md.

Manifests are cached until their file changes; overlays are built on demand when stale.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import ImageNotFound, InvalidInput, NotFound
from provisiond.images import load_manifest
from provisiond.overlays import ensure_overlay

HEX_RE = re.compile(r"[0-9a-f]{64}")


class OverlayUnavailable(NotFound):
    """The node's overlay cannot be built or is not there."""


class ManifestCache:
    """Image manifests by name, re-read only when manifest.json changes; a name is stat'ed
    at most once per `interval` seconds (no syscall on most requests)."""

    def __init__(self, config: Config, interval: float = 1.0):
        self.config = config
        self.interval = interval
        self._cache: dict[str, tuple[tuple, dict]] = {}
        self._checked: dict[str, float] = {}

    def get(self, name: str) -> dict:
        now = time.monotonic()
        if name in self._cache and now - self._checked.get(name, 0) < self.interval:
            return self._cache[name][1]
        self._checked[name] = now
        return self._load(name)

    def _load(self, name: str) -> dict:
        path = self.config.images_dir / name / "manifest.json"
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_ino, st.st_size)  # a rename within a tick: new inode
        except (FileNotFoundError, NotADirectoryError):
            self._cache.pop(name, None)
            raise ImageNotFound(f"no image named {name!r} has been built") from None
        cached = self._cache.get(name)
        if cached and cached[0] == stamp:
            return cached[1]
        manifest = load_manifest(self.config, name)
        self._cache[name] = (stamp, manifest)
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

