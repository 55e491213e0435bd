"""What templates see: `node`, `nodes`, `server`, `image`, `overlay` (and, in runtime
overlays only, `secrets`), with a cheap digest of each for the build cache.

A Snapshot is one reading of the inventory; it is reused while the inventory file is
unchanged, so a request-time `ensure_overlay` does not merge 10,000 nodes again.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from provisiond.config import Config
from provisiond.errors import NotFound
from provisiond.images import load_manifest
from provisiond.inventory import InventoryStore, Node, load_nodes
from provisiond.inventory.model import Record, node_sort_key


BUILD_TIMES = frozenset({"built_at", "build_seconds", "layer_build_seconds"})
# The fields node_context adds, and the record fields each is made from.
DERIVED_FIELDS = {"name": (), "ipaddr": ("netdevs",), "macs": ("netdevs",),
                  "primary_netdev": ("netdevs",)}
RECORD_FIELDS = frozenset(Record.model_fields)


def digest_of(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def server_context(config: Config) -> dict:
    server = config.server
    return {
        "address": server.address, "port": config.http.port, "domain": server.domain,
        "url": config.server_url,
        "ssh_authorized_keys": list(server.ssh_authorized_keys),
    }


def node_context(node: Node) -> dict:
    """The merged record with every field present (unset ones are None) plus helpers."""
    data = node.record.model_dump(mode="json")
    primary = node.primary_netdev
    data.update(name=node.name, ipaddr=node.ipaddr, macs=node.macs,
                primary_netdev=primary[0] if primary else None)
    return data


def nodes_context(nodes: dict[str, Node], names: list[str]) -> list[dict]:
    """Every node's name and addresses, in the order of `names` (for /etc/hosts)."""
    result = []
    for name in names:
        primary = nodes[name].primary_netdev
        result.append({"name": name, "ipaddr": primary[1].ipaddr if primary else None,
                       "ipaddr6": primary[1].ipaddr6 if primary else None})
    return result


@dataclass
class Snapshot:
    """One consistent reading of the inventory and the server settings."""

    nodes: dict[str, Node]
    server: dict
    names: list[str] = field(default_factory=list)
    """Every node's name, in natural order."""
    all_nodes: list[dict] = field(default_factory=list)
    all_nodes_digest: str = ""
    server_digest: str = ""
    _node_data: dict[str, dict] = field(default_factory=dict)
    _node_inputs: dict[tuple, str] = field(default_factory=dict)

    def __post_init__(self):
        self.names = sorted(self.nodes, key=node_sort_key)
        self.all_nodes = nodes_context(self.nodes, self.names)
        self.all_nodes_digest = digest_of(self.all_nodes)
        self.server_digest = digest_of(self.server)

    def node_data(self, name: str) -> dict:
        """The node's template data, computed once per snapshot."""
        if name not in self._node_data:
            self._node_data[name] = node_context(self.nodes[name])
        return self._node_data[name]

    def node_inputs(self, name: str, fields: frozenset[str] | None = None) -> str:
        """The node's name and the record fields behind the template `fields` (None: the
        whole record) as pydantic's JSON (no dict round trip; the build key hashes it)."""
        include = record_fields(fields)
        if (name, include) not in self._node_inputs:
            record = self.nodes[name].record.model_dump_json(include=include)
            self._node_inputs[name, include] = f"{name}\0{record}"
        return self._node_inputs[name, include]


@functools.cache
def record_fields(fields: frozenset[str] | None) -> frozenset[str] | None:
    """The record fields the template fields of `node` are made from; None (the whole
    record) when `fields` is None or names something that is neither, or a dict method
    (which Jinja's `node.x` finds before a field of that name)."""
    if fields is None:
        return None
    result: set[str] = set()
    for name in fields:
        if hasattr(dict, name):  # Jinja reads `node.values` as the dict's method: all of it
            return None
        if name in DERIVED_FIELDS:
            result.update(DERIVED_FIELDS[name])
        elif name in RECORD_FIELDS:
            result.add(name)
        else:
            return None
    return frozenset(result)


_SNAPSHOTS: dict[str, tuple[tuple, Snapshot]] = {}


def take_snapshot(config: Config, reuse: bool = True) -> Snapshot:
    """The inventory as it is now; with `reuse`, the last snapshot if nothing changed
    (the inventory file's stat on the files store, the stored version elsewhere: on etcd
    the file in the state dir is not the inventory)."""
    store = InventoryStore(config)
    key = str(store.path)
    stamp = store.file_stamp()
    signature = (stamp if stamp is not None else store.current().digest,
                 digest_of(server_context(config)))
    cached = _SNAPSHOTS.get(key)
    if reuse and cached and cached[0] == signature:
        return cached[1]
    snapshot = Snapshot(nodes=load_nodes(config), server=server_context(config))
    _SNAPSHOTS[key] = (signature, snapshot)
    return snapshot


def image_digest(manifest: dict) -> str:
    """What a node boots, as one digest ("sha256:<hex>"): the kernel's and the layers'
    digests in order, the kernel args and the init. Not where or when the image was built
    (the recipe's path, build times): the same content has the same digest on any server,
    for job constraints (the nomad-client overlay's meta)."""
    content = {"kernel": manifest.get("kernel", {}).get("digest"),
               "layers": [layer.get("digest") for layer in manifest.get("layers", [])],
               "kernel_args": manifest.get("kernel_args"), "init": manifest.get("init")}
    return f"sha256:{digest_of(content)}"


class ImageCache:
    """Image manifests by name, read once per build; a missing image gives None. `load`
    reads one (a server's reads it from the copy its watch keeps), load_manifest by
    default."""

    def __init__(self, config: Config, load: Callable[[str], dict] | None = None):
        self.config = config
        self._read = load or functools.partial(load_manifest, config)
        self._manifests: dict[str, tuple[dict | None, str]] = {}

    def get(self, name: str | None) -> tuple[dict | None, str]:
        """(manifest, digest of its content): when and how fast it was built is left out,
        so rebuilding an image that did not change rebuilds no overlay. The manifest
        templates see carries `digest` too (image_digest)."""
        if name not in self._manifests:
            manifest = self._load(name) if name else None
            content = {k: v for k, v in (manifest or {}).items() if k not in BUILD_TIMES}
            if manifest is not None:
                manifest = {**manifest, "digest": image_digest(manifest)}
            self._manifests[name] = (manifest, digest_of(content if manifest else None))
        return self._manifests[name]

    def _load(self, name: str) -> dict | None:
        try:
            return self._read(name)
        except NotFound:
            return None
