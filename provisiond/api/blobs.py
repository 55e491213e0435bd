"""Immutable blobs by digest: ETag = digest, cached forever, Range, sent with sendfile."""

from __future__ import annotations

import time

from flask import Blueprint, request, send_file

from provisiond.api.services import log_step, services
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
    node = _kernel_fetch(svc, hexdigest)
    if node:
        log_step(node, "kernel", response, started)
    return response


def _kernel_fetch(svc, hexdigest: str) -> str | None:
    """If the requester is a node fetching its image's kernel, record phase `kernel`."""
    node = svc.table.node_for_ip(request.remote_addr or "")
    if node is None or not node.record.image or request.headers.get("Range"):
        return None
    try:
        kernel = svc.manifests.get(node.record.image)["kernel"]["digest"]
    except (ProvisiondError, KeyError, TypeError):
        return None
    if kernel != f"sha256:{hexdigest}":
        return None
    svc.phases.record(node.name, NodePhase.KERNEL)
    return node.name
