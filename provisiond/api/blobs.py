"""Immutable blobs by digest: ETag = digest, cached forever, Range, sent with sendfile
(a whole blob is sent by api.whole in front of Flask, with the same headers). A blob this
server lacks is fetched from its peers and checked first (provisiond.boot.peers), unless
the request is itself a peer's fetch."""

from __future__ import annotations

import time

from flask import Blueprint, request, send_file
from werkzeug.http import http_date

from provisiond.api.services import client_address, log_step, services
from provisiond.boot.artifacts import HEX_RE, blob_file
from provisiond.boot.peers import PEER_HEADER, local_or_fetched
from provisiond.errors import NotFound, ProvisiondError
from provisiond.states import NodePhase

bp = Blueprint("blobs", __name__)
ONE_YEAR = 31536000
PREFIX = "/blobs/sha256/"
RULE = PREFIX + "<hexdigest>"
CACHE_CONTROL = f"public, max-age={ONE_YEAR}, immutable"


@bp.get(RULE)
def blob(hexdigest: str):
    started = time.monotonic()
    svc = services()
    if request.headers.get(PEER_HEADER):
        path = blob_file(svc.config, hexdigest)
    else:
        path = local_or_fetched(svc.config, hexdigest)
    try:
        # A path (not a file object) lets gunicorn's file wrapper use sendfile.
        response = send_file(path, mimetype="application/octet-stream", conditional=True,
                             etag=f"sha256:{hexdigest}", max_age=ONE_YEAR)
    except FileNotFoundError:
        raise NotFound(f"no blob sha256:{hexdigest}") from None
    response.cache_control.public = True
    response.cache_control.immutable = True
    note_step(svc, request.environ, hexdigest, started)
    return response


def whole_blob(svc, environ: dict, hexdigest: str) -> tuple | None:
    """For api.whole: the blob's path, the headers the view sends, and what notes the
    boot step once the file is open."""
    if not HEX_RE.fullmatch(hexdigest):
        return None
    started = time.monotonic()
    return blob_file(svc.config, hexdigest), [
        ("Content-Type", "application/octet-stream"),
        ("Content-Disposition", f"inline; filename={hexdigest}"),
        ("ETag", f'"sha256:{hexdigest}"'), ("Cache-Control", CACHE_CONTROL),
        ("Expires", http_date(time.time() + ONE_YEAR))], \
        lambda: note_step(svc, environ, hexdigest, started)


def note_step(svc, environ: dict, hexdigest: str, started: float) -> None:
    """A blob fetched by a node is a boot step; its kernel (whole) is the phase `kernel`."""
    node = svc.table.node_for_ip(client_address(environ))
    if node is None:
        return
    what = "kernel" if _is_kernel(svc, node, hexdigest) else f"blob {hexdigest[:12]}"
    if what == "kernel" and not environ.get("HTTP_RANGE"):
        svc.phases.record(node.name, NodePhase.KERNEL)
    log_step(node.name, what, started, environ)


def _is_kernel(svc, node, hexdigest: str) -> bool:
    """True if `hexdigest` is the kernel of the node's image."""
    if not node.record.image:
        return False
    try:
        kernel = svc.manifests.get(node.record.image)["kernel"]["digest"]
    except (ProvisiondError, KeyError, TypeError):
        return False
    return kernel == f"sha256:{hexdigest}"
