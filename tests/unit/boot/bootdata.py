"""Boot test data written the way the other parts write it (docs/contracts.md)."""

from __future__ import annotations

import hashlib
import json
import re
import socket
from pathlib import Path

from provisiond.boot.dhcp_packet import encode_request
from provisiond.config import Config
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import NetDev, Record
from provisiond.state.layout import Layout


def mac_of(index: int) -> str:
    return "52:54:00:%02x:%02x:%02x" % ((index >> 16) & 255, (index >> 8) & 255, index & 255)


def ip_of(index: int, net: str = "10.99") -> str:
    return f"{net}.{index // 250}.{index % 250 + 2}"


def add_nodes(config: Config, count: int, image: str | None = "tiny", net: str = "10.99",
              netmask: str = "255.255.0.0", gateway: str | None = None,
              kernel_args: list[str] | None = None) -> None:
    """Nodes n1..nCOUNT with MAC mac_of(i) and address ip_of(i)."""
    with InventoryStore(config).edit() as inv:
        for i in range(1, count + 1):
            dev = NetDev(mac=mac_of(i), ipaddr=ip_of(i, net), netmask=netmask,
                         gateway=gateway, ipaddr6=f"fd00::{i:x}")
            inv.nodes[f"n{i}"] = Record(image=image, netdevs={"eth0": dev},
                                        kernel_args=kernel_args)


def relayed(mac: str, msg: int, *options) -> bytes:
    """A DHCP request as a relay at 127.0.0.1 sends it (giaddr 127.0.0.1: the reply comes
    back to loopback)."""
    data = bytearray(encode_request(mac, msg, xid=7, options=list(options)))
    data[24:28] = socket.inet_aton("127.0.0.1")
    return bytes(data)


def add_blob(config: Config, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    config.blob_dir.mkdir(parents=True, exist_ok=True)
    (config.blob_dir / digest).write_bytes(data)
    return f"sha256:{digest}"


def add_image(config: Config, name: str = "tiny", layers: int = 2) -> dict:
    """A manifest with a kernel blob and `layers` layer blobs, as provisiond.images writes."""
    kernel = add_blob(config, b"kernel-" + name.encode())
    layer_list = [{"digest": add_blob(config, f"layer{i}-{name}".encode()), "size": 10,
                   "key": f"k{i}", "kind": "busybox", "compression": "zstd",
                   "description": f"layer {i}"} for i in range(layers)]
    manifest = {"name": name, "kernel": {"digest": kernel, "size": 13, "version": "6.1"},
                "layers": layer_list, "kernel_args": ["console=ttyS0"], "init": "/sbin/init",
                "recipe": {"path": "x", "sha256": "0"}, "built_at": "2026-11-22T00:00:00Z",
                "build_seconds": 1.0, "total_size": 33}
    path = config.images_dir / name / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return manifest


def add_overlay(config: Config, node: str, kind: str, data: bytes) -> Path:
    """Put a built overlay where provisiond.overlays.ensure_overlay returns it."""
    path = Layout.of(config).overlay_builds / node / f"{kind}.cpio.zst"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


TOKEN_RE = re.compile(r"provisiond\.token=(\S+)")


def token_in(script: str) -> str:
    """The provisioning token on the kernel line of an iPXE script."""
    return TOKEN_RE.search(script).group(1)


def node_env(index: int, port: int = 700, address: str | None = None) -> dict:
    """A Flask test client's environ_base for a request from node n<index>'s address (or
    `address`) and a source `port` (below 1024: as root on the node)."""
    return {"REMOTE_ADDR": address or ip_of(index), "REMOTE_PORT": str(port)}


def exchange(client, index: int, token: str | None = None, **env):
    """POST the token (by default one from a newly served script) as node n<index>."""
    if token is None:
        token = token_in(client.get(f"/boot/ipxe/{mac_of(index)}").get_data(as_text=True))
    return client.post(f"/api/v1/credentials/n{index}", data={"token": token},
                       environ_base=node_env(index, **env))


def credential(client, index: int) -> dict:
    """Headers carrying node n<index>'s credential, got the way its agent gets it."""
    response = exchange(client, index)
    assert response.status_code == 200, response.json
    return {"Authorization": f"Bearer {response.get_data(as_text=True).strip()}"}
