"""Render a node's overlays and pack them, with a cache key of what each one reads.

Each overlay's key hashes its source tree and only the variables its templates use, and of
`node` only the fields they name (source.py; a template using `node` whole reads all of it):
an overlay that reads `nodes` (hosts) changes when any node's name or address changes, one
that reads `node.netdevs` when that node's netdevs change. A node's system overlays are
split in two builds: "shared" (those that read neither `node` nor secrets, the same for
every node with the same list and image) and "system" (the node-specific rest).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from jinja2 import StrictUndefined

from provisiond import archive
from provisiond.config import Config
from provisiond.errors import InvalidInput
from provisiond.inventory.secrets import SecretStore, runtime_secrets
from provisiond.overlays.context import ImageCache, Snapshot, digest_of
from provisiond.overlays.hostkeys import ensure_host_keys, host_key_signature, make_host_keys
from provisiond.overlays.source import Overlay, load_overlay
from provisiond.overlays.templates import OverlayTemplateError, render_template, split_files
from provisiond.state.layout import Layout

FORMAT = "provisiond-overlay-4"  # 4: system overlays carry their copies (COPIES)
# Where a system overlay's archive holds its entries again (files as hard links, no data
# twice): the node's /init copies this tree over the image's root, after an unpacked boot's
# whiteouts, as the mounted boot copies it over the stacked layers (init.j2, OVERLAYS).
COPIES = ".provisiond/overlays"
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

    def __init__(self, config: Config, snapshot: Snapshot, durable_secrets: bool = True,
                 manifests: Callable[[str], dict] | None = None):
        """`manifests`: how to read an image's manifest (ImageCache's `load`)."""
        self.config = config
        self.snapshot = snapshot
        self.layout = Layout.of(config)
        self.build_dir = str(self.layout.overlay_builds)
        self.images = ImageCache(config, manifests)
        self.durable_secrets = durable_secrets
        """False: new secrets are not fsynced one by one (the caller syncs after a batch)."""
        self._secrets: dict[str, dict] = {}
        self._store: dict | None = None  # secrets.yaml, read once per builder
        self._signatures: dict[str, tuple | None] = {}
        self._overlays: dict[str, Overlay] = {}
        self._plans: dict[tuple, tuple] = {}
        self._slurm_conf: str | None | bool = False  # False: not read yet

    def compression(self, kind: str) -> str:
        return RUNTIME_COMPRESSION if kind == "runtime" else self.config.build.compression

    def overlays(self, node: str, kind: str) -> list[Overlay]:
        """The node's overlays of `kind`: shared and system split its system_overlays."""
        record = self.snapshot.nodes[node].record
        if kind == "runtime":
            return [self.overlay(name) for name in record.runtime_overlays or []]
        overlays = [self.overlay(name) for name in record.system_overlays or []]
        for overlay in overlays:
            if overlay.runtime_only:
                what = f"file {overlay.secret_files[0]} reads secrets" if \
                    overlay.secret_files else "holds secrets"
                raise OverlayTemplateError(
                    f"overlay {overlay.name}: {what}, which reach runtime overlays only "
                    f"(served to the node alone): node {node} must list it in "
                    "runtime_overlays, not system_overlays (served to anyone)")
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
        common, fields, secret = self._plan(node, kind)
        if kind == "shared":
            return common
        parts = [common, self.snapshot.node_inputs(node, fields)]
        if secret:
            parts.append(self.secrets_key(node))
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def _plan(self, node: str, kind: str) -> tuple[str, frozenset | None, bool]:
        """What the node's `kind` key is made of, worked out once per (overlay list, image):
        the digest of everything such nodes share, the node fields the overlays read (None:
        all of them), and whether they read secrets."""
        record = self.snapshot.nodes[node].record
        names = record.runtime_overlays if kind == "runtime" else record.system_overlays
        signature = (kind, tuple(names or ()), record.image)
        if signature not in self._plans:
            overlays = self.overlays(node, kind)
            common = [FORMAT, kind, self.compression(kind),
                      [self.common_key(o, node) for o in overlays]]
            self._plans[signature] = (
                digest_of(common), _union(o.node_fields for o in overlays if "node" in o.uses),
                kind == "runtime" and any("secrets" in o.uses for o in overlays))
        return self._plans[signature]

    def common_key(self, overlay: Overlay, node: str) -> str:
        """The hash of what the overlay reads that is not the node's own (its tree, and the
        nodes list, the server settings and the image where its templates use them)."""
        parts = [overlay.name, overlay.digest]
        uses = overlay.uses
        if "nodes" in uses:
            parts.append(self.snapshot.all_nodes_digest)
        if "server" in uses:
            parts.append(self.snapshot.server_digest)
        if "image" in uses:
            parts.append(self.images.get(self.snapshot.nodes[node].record.image)[1])
        if "slurm_conf" in uses:
            parts.append(digest_of(self.slurm_conf()))
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def uses_secrets(self, node: str, kind: str) -> bool:
        return self._plan(node, kind)[2]

    def secrets_exist(self, node: str, kind: str) -> bool:
        """False when keying this build would first have to generate secrets."""
        return not self.uses_secrets(node, kind) or self._key_signature(node) is not None

    def _key_signature(self, node: str) -> tuple | None:
        if self._signatures.get(node) is None:
            self._signatures[node] = host_key_signature(self.config, node)
        return self._signatures[node]

    def make_secrets(self, node: str, kind: str) -> None:
        """Make the secrets the node's `kind` build reads that are missing (before it is
        keyed: the key then names the secrets it is built from)."""
        if self.uses_secrets(node, kind):
            make_host_keys(self.config, node, durable=self.durable_secrets)
            self._signatures.pop(node, None)

    def secrets_key(self, node: str) -> str:
        """What identifies the node's secrets: the wanted key types and the key files'
        signature (from a stat: reading and hashing 10,000 nodes' keys cost more than the
        rest of an unchanged build), and a digest of its stored secrets."""
        if self._key_signature(node) is None:
            self.make_secrets(node, "runtime")
        return repr((self.config.build.ssh_host_key_types, self._key_signature(node),
                     digest_of(self.stored_secrets(node))))

    def stored_secrets(self, node: str) -> dict[str, str]:
        """The node's secrets from `provisiond secret set` (inventory.secrets)."""
        if self._store is None:
            self._store = SecretStore(self.config).read()
        return runtime_secrets(self._store, self.snapshot.nodes[node])

    def secrets(self, node: str) -> tuple[dict, str]:
        """(the node's secrets, their key for the build cache): the stored ones and the
        generated `ssh_host_keys`."""
        if node not in self._secrets:
            keys = ensure_host_keys(self.config, node, durable=self.durable_secrets)
            self._signatures.pop(node, None)
            self._secrets[node] = _Secrets(node, {**self.stored_secrets(node),
                                                  "ssh_host_keys": keys})
        return self._secrets[node], self.secrets_key(node)

    def context(self, overlay: Overlay, node: str, kind: str) -> dict:
        context = {
            "node": self.snapshot.node_data(node), "nodes": self.snapshot.all_nodes,
            "server": self.snapshot.server, "overlay": {"name": overlay.name, "kind": kind},
            "image": self.images.get(self.snapshot.nodes[node].record.image)[0],
        }
        if "slurm_conf" in overlay.uses:
            text = self.slurm_conf()
            context["slurm_conf"] = text if text is not None else StrictUndefined(
                hint=f"no {self.layout.slurm_conf} yet: run `provisiond slurm config`")
        if kind == "runtime" and "secrets" in overlay.uses:
            context["secrets"] = self.secrets(node)[0]
        return context

    def slurm_conf(self) -> str | None:
        """slurm.conf as `provisiond slurm config` wrote it (None if it did not), read
        once per builder: every node gets the text slurmctld was given."""
        if self._slurm_conf is False:
            try:
                self._slurm_conf = self.layout.slurm_conf.read_text()
            except FileNotFoundError:
                self._slurm_conf = None
            except (OSError, UnicodeDecodeError) as exc:
                raise InvalidInput(f"{self.layout.slurm_conf}: cannot read: "
                                   f"{getattr(exc, 'strerror', None) or 'not UTF-8'}") from None
        return self._slurm_conf

    def pack(self, node: str, kind: str) -> bytes:
        """The node's build: one archive per overlay, each compressed (the kernel unpacks a
        concatenation of them) and holding its entries twice (in place and under COPIES),
        or an empty archive when there is none; runtime: a single archive, as busybox cpio
        reads one only (the agent unpacks it over the booted root)."""
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
        key = f"{self.compression('system')}:{self.common_key(overlay, node)}"
        if key not in _SHARED:
            if len(_SHARED) >= SHARED_LIMIT:
                del _SHARED[next(iter(_SHARED))]
            _SHARED[key] = self._packed(overlay, node)
        return _SHARED[key]

    def _packed(self, overlay: Overlay, node: str) -> bytes:
        entries = self.render(overlay, node, "system")
        return archive.compress(archive.pack_with_copies(entries, COPIES),
                                self.compression("system"))

    def render(self, overlay: Overlay, node: str, kind: str) -> list[archive.Entry]:
        return render_overlay(overlay, self.context(overlay, node, kind), node)



def _union(field_sets) -> frozenset | None:
    """The union of the overlays' node field sets; None if one may read all of the node."""
    result: frozenset = frozenset()
    for fields in field_sets:
        if fields is None:
            return None
        result |= fields
    return result


class _Secrets(dict):
    """A node's secrets as templates see them: one not set is an error that says how to
    set it (not jinja's "'dict object' has no attribute")."""

    def __init__(self, node: str, values: dict):
        super().__init__(values)
        self.node = node

    def __missing__(self, key):
        return StrictUndefined(hint=f"secret {key} of node {self.node} is not set: "
                               f"`provisiond secret set node {self.node} {key} --file FILE` "
                               "(or set it on a profile)")
