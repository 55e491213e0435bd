"""iPXE entry points: the chain script, the per-node script, and the iPXE binaries."""

from __future__ import annotations

import os
import stat
import time

from flask import Blueprint, Response, send_file

from provisiond.api.services import log_step, services
from provisiond.boot.discovery import enlisting
from provisiond.boot.ipxe import chain_script, discovery_script, retry_script
from provisiond.boot.tftp_request import refusal
from provisiond.errors import InvalidInput, NotFound
from provisiond.inventory.model import normalise_mac
from provisiond.states import NodePhase

bp = Blueprint("boot", __name__)
IPXE_TYPE = "text/plain; charset=utf-8"


@bp.get("/boot/ipxe")
def chain():
    return Response(chain_script(services().config), content_type=IPXE_TYPE)


@bp.get("/boot/ipxe/<mac>")
def node_ipxe(mac: str):
    started = time.monotonic()
    svc = services()
    try:
        mac = normalise_mac(mac)
    except ValueError:
        raise InvalidInput(f"not a MAC address: {mac[:40]!r}") from None
    table = svc.table
    entry = table.by_mac.get(mac)
    if entry is None:
        return Response(unknown_mac_script(svc, mac), content_type=IPXE_TYPE)
    text = svc.scripts.script(table, entry)
    response = Response(text, content_type=IPXE_TYPE)
    response.headers["Cache-Control"] = "no-store"  # its token is good for one boot
    svc.phases.record(entry.node, NodePhase.IPXE)
    log_step(entry.node, "ipxe-script", started)
    return response


def unknown_mac_script(svc, mac: str) -> str:
    """The discovery image with discovery on (and a pool leasing unknown MACs), else a
    script saying the MAC is unknown."""
    config = svc.config
    if enlisting(config):
        return discovery_script(config, svc.manifests, mac)
    return retry_script(config, f"unknown MAC {mac}: add it to a node's netdevs")


@bp.get("/boot/files/<name>")
def boot_file(name: str):
    """iPXE binaries (e.g. ipxe.efi for UEFI HTTP boot) from the TFTP root."""
    path = boot_file_path(services().config.tftp.root, name)
    if path is None:
        raise NotFound(f"no boot file {name[:60]!r}")
    return send_file(path, mimetype="application/octet-stream", max_age=3600)


def boot_file_path(root: str, name: str) -> str | None:
    """The regular file `name` resolves to under `root`, or None. A symlink leading out of
    the root is followed only if its target has the link's owner (Apache's
    SymLinksIfOwnerMatch): Debian's /usr/lib/ipxe/ipxe.efi -> /boot/ipxe.efi is served, a
    link someone made to a file of another user (root's) is not."""
    if refusal(name) is not None:
        return None
    real_root = os.path.realpath(root)
    link = os.path.join(real_root, name)
    path = os.path.realpath(link)
    try:
        target = os.stat(path)
        if os.path.commonpath([real_root, path]) != real_root \
                and os.lstat(link).st_uid != target.st_uid:
            return None
    except (OSError, ValueError):
        return None
    return path if stat.S_ISREG(target.st_mode) else None
