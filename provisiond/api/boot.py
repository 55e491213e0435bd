"""iPXE entry points: the chain script, the per-node script, and the iPXE binaries."""

from __future__ import annotations

import os
import time

from flask import Blueprint, Response, send_file
from werkzeug.security import safe_join

from provisiond.api.services import log_step, services
from provisiond.boot.ipxe import chain_script, retry_script
from provisiond.errors import InvalidInput, NotFound
from provisiond.inventory.model import normalise_mac
from provisiond.states import NodePhase

bp = Blueprint("boot", __name__)
IPXE_TYPE = "text/plain; charset=utf-8"


@bp.get("/boot/ipxe")
def chain():
    return Response(chain_script(services().config), mimetype=IPXE_TYPE)


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
        text = retry_script(svc.config, f"unknown MAC {mac}: add it to a node's netdevs")
        return Response(text, mimetype=IPXE_TYPE)
    text = svc.scripts.script(table, entry)
    response = Response(text, mimetype=IPXE_TYPE)
    svc.phases.record(entry.node, NodePhase.IPXE)
    log_step(entry.node, "ipxe-script", started)
    return response


@bp.get("/boot/files/<name>")
def boot_file(name: str):
    """iPXE binaries (e.g. ipxe.efi for UEFI HTTP boot) from the TFTP root."""
    root = services().config.tftp.root
    path = safe_join(root, name)
    if path is None or not os.path.isfile(path):
        raise NotFound(f"no boot file {name[:60]!r}")
    return send_file(path, mimetype="application/octet-stream", max_age=3600)
