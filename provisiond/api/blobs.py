"""Immutable blobs by digest: ETag = digest, cached forever, Range, sent with sendfile."""

from __future__ import annotations

import time

from flask import Blueprint, request, send_file

from provisiond.api.services import client_address, log_step, services
from provisiond.boot.artifacts import blob_file
from provisiond.errors import NotFound, ProvisiondError
from provisiond.states import NodePhase

bp = Blueprint("blobs", __name__)
ONE_YEAR = 31536000


@bp.get("/blobs/sha256/<hexdigest>")
def blob(hexdigest: str):
    started = time.monotonic()
    svc = services()
    path = blob_file(svc.config, hexdigest)
    try:
        # A path (not a file object) lets gunicorn's file wrapper use sendfile.
        response = send_file(path, mimetype="application/octet-stream", conditional=True,
                             etag=f"sha256:{hexdigest}", max_age=ONE_YEAR)
    except FileNotFoundError:
        raise NotFound(f"no blob sha256:{hexdigest}") from None
    response.cache_control.public = True
    response.cache_control.immutable = True
    node = svc.table.node_for_ip(client_address())
    if node is not None:
        what = "kernel" if _is_kernel(svc, node, hexdigest) else f"blob {hexdigest[:12]}"
        if what == "kernel" and not request.headers.get("Range"):
            svc.phases.record(node.name, NodePhase.KERNEL)
        log_step(node.name, what, started)
    return response


def _is_kernel(svc, node, hexdigest: str) -> bool:
    """True if `hexdigest` is the kernel of the node's image."""
    if not node.record.image:
        return False
    try:
        kernel = svc.manifests.get(node.record.image)["kernel"]["digest"]
    except (ProvisiondError, KeyError, TypeError):
        return False
    return kernel == f"sha256:{hexdigest}"
