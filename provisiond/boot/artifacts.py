"""Read what the image and overlay builders produced, following docs/contracts.md.

Manifests are cached until their stored revision changes; overlays are built on demand when stale.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from provisiond.boot.table import BootTable
from provisiond.config import Config
from provisiond.errors import ImageNotFound, InvalidInput, NodeNotFound, NotFound
from provisiond.images.manifests import manifest_entry, parse_manifest
from provisiond.overlays.build import build_node, output_path
from provisiond.overlays.context import Snapshot, server_context, take_snapshot
from provisiond.overlays.render import Builder
from provisiond.state.layout import KEYS, Layout
from provisiond.state.models import DamagedDocument, ImageManifest, parse
from provisiond.state.store import Entry

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
    """Image manifests by name, parsed again only when the stored manifest's revision
    changes (a build here or on another server); a name is read at most once per
    `interval` seconds, through `reads` (a server's WatchedCopy on etcd, whose reads cost
    no request: interval 0 there) or the store."""

    def __init__(self, config: Config, interval: float = 1.0, size: int = 256, reads=None):
        self.config = config
        self.interval = interval
        self.reads = reads
        self._cache = LruCache(size)  # name -> (revision, manifest, checked at)

    def get(self, name: str) -> dict:
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached and now - cached[2] < self.interval:
            return cached[1]
        return self._load(name, cached, now)

    def _load(self, name: str, cached: tuple | None, now: float) -> dict:
        try:
            entry = (stored_manifest(self.reads, name) if self.reads is not None
                     else manifest_entry(self.config, name))
        except ImageNotFound:
            self._cache.pop(name)
            raise
        same = cached and cached[0] == entry.revision
        manifest = cached[1] if same else self._read(entry)
        self._cache.put(name, (entry.revision, manifest, now))
        return manifest

    def _read(self, entry: Entry) -> dict:
        """The manifest, checked against ImageManifest: a damaged one is refused here, in
        one line naming it, not by a KeyError in the script it would have made."""
        manifest = parse_manifest(entry)
        parse(ImageManifest, manifest, entry.key, DamagedDocument)
        return manifest


def stored_manifest(reads, name: str) -> Entry:
    """The manifest of image `name` read through `reads`; ImageNotFound if it has none."""
    entry = reads.get(str(KEYS.image_manifest(name)))
    if entry is None:
        raise ImageNotFound(f"no image named {name!r} has been built")
    return entry


def blob_file(config: Config, hexdigest: str) -> Path:
    """The blob `sha256:<hexdigest>`; a malformed digest is InvalidInput."""
    if not HEX_RE.fullmatch(hexdigest):  # `match` + `$` let a trailing newline in
        raise InvalidInput("a blob is named by 64 lowercase hex digits")
    return Layout.of(config).blob(hexdigest)


class OverlayFiles:
    """Nodes' current overlays, as `ensure_overlay` gives them (built first if stale), with
    one Builder for all requests of `interval` s: a Builder reads each overlay's sources
    once, where ensure_overlay's new one per request walked and stat'ed them all (4.7 ms a
    request with the default profile: most of a boot storm's CPU). An edit to an overlay's
    sources is seen within `interval`, as manifests are.

    The nodes are those of `table()`, the worker's boot table (a new one: a new Builder at
    once), so overlays follow the inventory on the store as scripts do; without it, the
    inventory as take_snapshot reads it. `reads`: what manifests are read through (a
    server's WatchedCopy), load_manifest by default."""

    def __init__(self, config: Config, interval: float = 1.0,
                 table: Callable[[], BootTable] | None = None, reads=None):
        self.config = config
        self.interval = interval
        self.table = table
        self.manifests = (lambda name: parse_manifest(stored_manifest(reads, name))
                          ) if reads is not None else None
        self._builder: Builder | None = None
        self._made = 0.0
        self._nodes_of: BootTable | None = None  # the table self._snapshot was made of
        self._snapshot: Snapshot | None = None

    def path(self, node: str, kind: str) -> Path:
        """The node's current `kind` build. Its "system" part needs its shared part too (a
        node boots both): while that fails to build, so does the system part, not served
        without the overlays the shared one holds."""
        builder = self._current()
        if node not in builder.snapshot.nodes:
            raise NodeNotFound(f"no node named {node!r}")
        if kind == "system":
            build_node(builder, node, "shared")
        build_node(builder, node, kind)
        path = output_path(self.config, builder, node, kind)
        if not path.is_file():
            raise OverlayUnavailable(f"no {kind} overlay built for {node}")
        return path

    def _current(self) -> Builder:
        now = time.monotonic()
        snapshot = self._snapshot_of(self.table()) if self.table is not None else None
        if (self._builder is None or now - self._made >= self.interval
                or (snapshot is not None and self._builder.snapshot is not snapshot)):
            self._builder = Builder(self.config, snapshot or take_snapshot(self.config),
                                    manifests=self.manifests)
            self._made = now
        return self._builder

    def _snapshot_of(self, table: BootTable) -> Snapshot:
        if table is not self._nodes_of:
            self._snapshot = Snapshot(nodes=table.nodes, server=server_context(self.config))
            self._nodes_of = table
        return self._snapshot
