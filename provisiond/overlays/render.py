"""Render a node's overlays and pack them, with a cache key of exactly what each one read.

Each overlay's key hashes its source tree and only the variables its templates use: an
overlay that reads `nodes` (hosts) changes when any node changes, one that reads only `node`
when that node changes. A node's system overlays are split in two builds: "shared" (those
that read neither `node` nor secrets, the same for every node with the same list and image)
and "system" (the node-specific rest).
"""

from __future__ import annotations

import hashlib

from provisiond import archive
from provisiond.config import Config
from provisiond.errors import InvalidInput
from provisiond.overlays.context import ImageCache, Snapshot, digest_of
from provisiond.overlays.hostkeys import ensure_host_keys, host_key_signature
from provisiond.overlays.source import Overlay, load_overlay
from provisiond.overlays.templates import OverlayTemplateError, render_template, split_files

FORMAT = "provisiond-overlay-2"
KINDS = ("shared", "system", "runtime")
RUNTIME_COMPRESSION = "gzip"  # the node unpacks it with busybox, which has no zstd applet
SHARED_LIMIT = 64
# Packed node-independent overlays by content key, kept across builds and requests (hosts
# of 10,000 nodes takes ~70 ms to render and compress).
_SHARED: dict[str, bytes] = {}


def render_overlay(overlay: Overlay, context: dict, node: str) -> list[archive.Entry]:
    """The overlay's files for one node, as archive entries (parents included)."""
    entries = []
    for source in overlay.files:
        if source.kind == "dir":
            entries.append(archive.dir_entry(source.target, source.mode))
        elif source.kind == "symlink":
            entries.append(archive.symlink_entry(source.target, source.data.decode()))
        elif source.kind == "template":
            text = render_template(source.template, context, overlay.name, source.rel, node)
            entries += [archive.file_entry(path, body.encode(), source.mode)
                        for path, body in split_files(source.target, text)]
        else:
            entries.append(archive.file_entry(source.target, source.data, source.mode))
    return archive.with_parents(entries, overlay.dir_modes)


class Builder:
    """Keys and packed bytes of nodes' overlays for one snapshot of the inventory."""

    def __init__(self, config: Config, snapshot: Snapshot, durable_secrets: bool = True):
        self.config = config
        self.snapshot = snapshot
        self.build_dir = str(config.overlay_build_dir)
        self.images = ImageCache(config)
        self.durable_secrets = durable_secrets
        """False: new secrets are not fsynced one by one (the caller syncs after a batch)."""
        self._secrets: dict[str, dict] = {}
        self._signatures: dict[str, tuple | None] = {}
        self._overlays: dict[str, Overlay] = {}
        self._shared_keys: dict[tuple, str] = {}

    def compression(self, kind: str) -> str:
        return RUNTIME_COMPRESSION if kind == "runtime" else self.config.build.compression

    def overlays(self, node: str, kind: str) -> list[Overlay]:
        """The node's overlays of `kind`: shared and system split its system_overlays."""
        record = self.snapshot.nodes[node].record
        if kind == "runtime":
            return [self.overlay(name) for name in record.runtime_overlays or []]
        overlays = [self.overlay(name) for name in record.system_overlays or []]
        for overlay in overlays:
            if overlay.secret:
                raise OverlayTemplateError(
                    f"overlay {overlay.name} holds secrets: node {node} must list it in "
                    "runtime_overlays, not system_overlays")
        return [o for o in overlays if o.node_specific == (kind == "system")]

    def overlay(self, name: str) -> Overlay:
        """The overlay as it was when first asked for in this build (read once)."""
        if name not in self._overlays:
            self._overlays[name] = load_overlay(self.config, name)
        return self._overlays[name]

    def node_key(self, node: str, kind: str) -> str:
        """The hash of everything the node's `kind` build reads."""
        if kind not in KINDS:
            raise InvalidInput(f"overlay kind must be shared, system or runtime, not {kind!r}")
        if kind == "shared":
            return self._shared_key(node)
        keys = [self.overlay_key(o, node, kind) for o in self.overlays(node, kind)]
        return digest_of([FORMAT, kind, self.compression(kind), keys])

    def _shared_key(self, node: str) -> str:
        """The shared build's key, computed once per (overlay list, image)."""
        record = self.snapshot.nodes[node].record
        signature = (tuple(record.system_overlays or ()), record.image)
        if signature not in self._shared_keys:
            keys = [self.overlay_key(o, node, "system") for o in self.overlays(node, "shared")]
            self._shared_keys[signature] = digest_of(
                [FORMAT, "shared", self.compression("shared"), keys])
        return self._shared_keys[signature]

    def overlay_key(self, overlay: Overlay, node: str, kind: str) -> str:
        parts = [overlay.name, kind, overlay.digest]
        uses = overlay.uses
        if "node" in uses:
            parts.append(self.snapshot.node_digest(node, overlay.node_fields))
        if "nodes" in uses:
            parts.append(self.snapshot.all_nodes_digest)
        if "server" in uses:
            parts.append(self.snapshot.server_digest)
        if "image" in uses:
            parts.append(self.images.get(self.snapshot.nodes[node].record.image)[1])
        if "secrets" in uses and kind == "runtime":
            parts.append(self.secrets_key(node))
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def secrets_exist(self, node: str, kind: str) -> bool:
        """False when keying this build would first have to generate secrets."""
        if kind != "runtime":
            return True
        uses = any("secrets" in o.uses for o in self.overlays(node, kind))
        return not uses or self._key_signature(node) is not None

    def _key_signature(self, node: str) -> tuple | None:
        if self._signatures.get(node) is None:
            self._signatures[node] = host_key_signature(self.config, node)
        return self._signatures[node]

    def secrets_key(self, node: str) -> str:
        """What identifies the node's secrets, from file stats (reading 10,000 nodes' keys
        to hash them cost more than the rest of an unchanged build); makes missing keys."""
        if self._key_signature(node) is None:
            self._load_secrets(node)
        return digest_of(self._key_signature(node))

    def secrets(self, node: str) -> tuple[dict, str]:
        """(the node's secrets, their key for the build cache)."""
        return self._load_secrets(node), self.secrets_key(node)

    def _load_secrets(self, node: str) -> dict:
        if node not in self._secrets:
            keys = ensure_host_keys(self.config, node, durable=self.durable_secrets)
            self._signatures.pop(node, None)
            self._secrets[node] = {"ssh_host_keys": keys}
        return self._secrets[node]

    def context(self, overlay: Overlay, node: str, kind: str) -> dict:
        context = {
            "node": self.snapshot.node_data(node), "nodes": self.snapshot.all_nodes,
            "server": self.snapshot.server, "overlay": {"name": overlay.name, "kind": kind},
            "image": self.images.get(self.snapshot.nodes[node].record.image)[0],
        }
        if kind == "runtime" and "secrets" in overlay.uses:
            context["secrets"] = self.secrets(node)[0]
        return context

    def pack(self, node: str, kind: str) -> bytes:
        """The node's build: one archive per overlay, each compressed (the kernel unpacks a
        concatenation of them), or an empty archive when there is none; runtime: a single
        archive, as busybox cpio reads one only."""
        overlays = self.overlays(node, kind)
        if kind == "runtime":
            merged = [e for o in overlays for e in self.render(o, node, kind)]
            packed = archive.pack(archive.with_parents(merged))
            return archive.compress(packed, RUNTIME_COMPRESSION)
        if not overlays:
            return archive.compress(archive.pack([]), self.compression(kind))
        return b"".join(self.member(o, node) for o in overlays)

    def member(self, overlay: Overlay, node: str) -> bytes:
        """One overlay's compressed archive; node-independent ones are packed once."""
        if overlay.node_specific:
            return self._packed(overlay, node)
        key = f"{self.compression('system')}:{self.overlay_key(overlay, node, 'system')}"
        if key not in _SHARED:
            if len(_SHARED) >= SHARED_LIMIT:
                del _SHARED[next(iter(_SHARED))]
            _SHARED[key] = self._packed(overlay, node)
        return _SHARED[key]

    def _packed(self, overlay: Overlay, node: str) -> bytes:
        entries = self.render(overlay, node, "system")
        return archive.compress(archive.pack(entries), self.compression("system"))

    def render(self, overlay: Overlay, node: str, kind: str) -> list[archive.Entry]:
        return render_overlay(overlay, self.context(overlay, node, kind), node)
