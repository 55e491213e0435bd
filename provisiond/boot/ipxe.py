"""Per-node iPXE scripts: kernel, one initrd per image layer (its cpio, or for a mounted
boot the boot modules and each layer's file system image: provisiond.images.squash), then
the node's shared system overlays and its own system overlays (unpacked last, so they win).

The template is compiled once per process, and a rendered script is kept until the boot
table or the node's image manifest changes: most requests are a dict lookup, plus a new
provisioning token (provisiond.trust.tokens: an HMAC) put where the cached text holds
TOKEN_MARK, since a token is good for one boot only.
"""

from __future__ import annotations

import jinja2

from provisiond.boot.artifacts import LruCache, ManifestCache
from provisiond.boot.table import BootEntry
from provisiond.config import Config
from provisiond.errors import ProvisiondError
from provisiond.images.squash import boot_mode, layer_blobs, mounted_args, mounted_refused
from provisiond.trust import tokens

_ENV = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True)

NODE_SCRIPT = _ENV.from_string("""\
#!ipxe
# provisiond: {{ node }} ({{ image }})
echo provisiond: booting {{ node }} with image {{ image }}
{% if note %}echo provisiond: image {{ image }} {{ note }}
{% endif %}kernel {{ base }}/blobs/sha256/{{ kernel }} {{ args }} || goto failed
{% for name, url in initrds %}initrd --name {{ name }} {{ url }} || goto failed
{% endfor %}boot || goto failed
:failed
echo provisiond: boot of {{ node }} failed, retrying in {{ retry }} s
sleep {{ retry }}
chain --autofree {{ base }}/boot/ipxe/${mac}
""")

RETRY_SCRIPT = _ENV.from_string("""\
#!ipxe
echo provisiond: {{ reason }}
echo provisiond: retrying in {{ retry }} s
sleep {{ retry }}
chain --autofree {{ base }}/boot/ipxe/${mac}
""")

TOKEN_MARK = "@token@"  # no character of it can come from a node's record or a manifest
CHAIN_SCRIPT = "#!ipxe\nchain --autofree {base}/boot/ipxe/${{mac}}\n"
RETRY_SECONDS = 30


def base_url(config: Config) -> str:
    return config.server_url


def chain_script(config: Config) -> str:
    return CHAIN_SCRIPT.format(base=base_url(config))


def retry_script(config: Config, reason: str) -> str:
    """A script that says why there is nothing to boot and asks again later."""
    return RETRY_SCRIPT.render(reason=_echoable(reason), retry=RETRY_SECONDS,
                               base=base_url(config))


def _echoable(text: str) -> str:
    """`text` safe on an iPXE echo line (no expansion, no line break)."""
    return "".join(c for c in text if c.isprintable() and c not in "${}")


def node_script(config: Config, manifests: ManifestCache, entry: BootEntry, node) -> str:
    """The boot script of `node`, or a retry script saying what is missing."""
    if not entry.image:
        return retry_script(config, f"node {entry.node} has no image assigned")
    try:
        manifest = manifests.get(entry.image)
    except ProvisiondError as exc:
        return retry_script(config, f"{entry.node}: {exc}")
    base = base_url(config)
    node_args = (node.record.kernel_args or []) if node is not None else []
    mode = boot_mode(manifest, node_args)
    note = _echoable(mounted_refused(manifest, node_args) or "")
    initrds = [(f"l{i}", f"{base}/blobs/sha256/{digest.removeprefix('sha256:')}")
               for i, digest in enumerate(layer_blobs(manifest, mode))]
    for kind in ("shared", "system"):
        initrds.append((f"l{len(initrds)}", f"{base}/overlays/{entry.node}/{kind}"))
    return NODE_SCRIPT.render(
        node=entry.node, image=entry.image, base=base, retry=RETRY_SECONDS, note=note,
        kernel=manifest["kernel"]["digest"].removeprefix("sha256:"), initrds=initrds,
        args=" ".join(kernel_args(config, manifest, entry.node, node, initrds, mode)))


def discovery_script(config: Config, manifests: ManifestCache, mac: str) -> str:
    """The script of an unknown MAC while discovery is on: the discovery image, whose
    collector reports the machine's facts and asks what to do (no overlays, no token:
    the machine is nobody yet)."""
    image = config.discovery.image
    try:
        manifest = manifests.get(image)
    except ProvisiondError as exc:
        return retry_script(config, f"discovery of {mac}: {exc}")
    base = base_url(config)
    initrds = [(f"l{i}", f"{base}/blobs/sha256/{layer['digest'].removeprefix('sha256:')}")
               for i, layer in enumerate(manifest["layers"])]
    args = [f"initrd={n}" for n, _ in initrds] + (manifest.get("kernel_args") or [])
    args += [f"provisiond.url={base}", f"provisiond.discover={mac}"]
    return NODE_SCRIPT.render(
        node=f"discovery of {mac}", image=image, base=base, retry=RETRY_SECONDS, note="",
        kernel=manifest["kernel"]["digest"].removeprefix("sha256:"), initrds=initrds,
        args=" ".join(args))


def kernel_args(config: Config, manifest: dict, name: str, node, initrds,
                mode: str = "unpacked") -> list[str]:
    """initrd=... per initrd, the image's args, the node's args, provisiond.* (contracts);
    the token is TOKEN_MARK, replaced by a new one each time the script is served. A
    mounted boot starts in the boot kit (rdinit=) and says how many layers /init mounts."""
    args = [f"initrd={n}" for n, _ in initrds]
    args += mounted_args(manifest) if mode == "mounted" else []
    args += manifest.get("kernel_args") or []
    args += (node.record.kernel_args or []) if node is not None else []
    if manifest.get("init") and manifest["init"] != "/sbin/init":
        args.append(f"provisiond.init={manifest['init']}")
    return args + [f"provisiond.url={base_url(config)}", f"provisiond.node={name}",
                   f"provisiond.token={TOKEN_MARK}"]


class ScriptCache:
    """Rendered scripts by MAC (at most `size`), reused while the boot table and the node's
    manifest are the same objects (both are replaced, never changed, when their files
    change). A new table empties the cache: no entry keeps an old table alive. Each script
    served carries a token of its own, signed with the key read through `reads` (a
    server's WatchedCopy) or the store."""

    def __init__(self, config: Config, manifests: ManifestCache, size: int = 4096,
                 reads=None):
        self.config = config
        self.manifests = manifests
        self._table = None
        self._scripts = LruCache(size)  # mac -> (manifest, text, token binding)
        self._key = tokens.SigningKey(config, reads)

    def script(self, table, entry: BootEntry) -> str:
        if table is not self._table:
            self._scripts.clear()
            self._table = table
        manifest = self._manifest(entry.image)
        hit = self._scripts.get(entry.mac)
        if not hit or hit[0] is not manifest:
            node = table.nodes.get(entry.node)
            hit = (manifest, node_script(self.config, self.manifests, entry, node),
                   tokens.binding_for(node, entry.mac) if node is not None else None)
            self._scripts.put(entry.mac, hit)
        return self._with_token(hit[1], hit[2])

    def _with_token(self, text: str, binding: tokens.Binding | None) -> str:
        if binding is None or TOKEN_MARK not in text:
            return text
        return text.replace(TOKEN_MARK, tokens.mint(self._key.get(), binding))

    def _manifest(self, image: str | None) -> dict | None:
        try:
            return self.manifests.get(image) if image else None
        except ProvisiondError:
            return None
