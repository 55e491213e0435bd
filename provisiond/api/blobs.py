"""Immutable blobs by digest: ETag = digest, cached forever, Range, sent with sendfile.

A whole blob (GET, no Range, no condition) is the most frequent request of a boot storm:
`WholeBlobs` answers it in front of Flask, which cost several times the rest of such a
request; Flask's view answers everything else (ranges, 304s, errors).
"""

from __future__ import annotations

import os
import time

from flask import Blueprint, request, send_file
from werkzeug.http import http_date
from werkzeug.wsgi import wrap_file

from provisiond.api.services import client_address, log_step, services
from provisiond.boot.artifacts import HEX_RE, blob_file
from provisiond.errors import NotFound, ProvisiondError
from provisiond.states import NodePhase

bp = Blueprint("blobs", __name__)
ONE_YEAR = 31536000
PREFIX = "/blobs/sha256/"
CACHE_CONTROL = f"public, max-age={ONE_YEAR}, immutable"
CONDITIONS = ("HTTP_RANGE", "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_MATCH",
              "HTTP_IF_UNMODIFIED_SINCE", "HTTP_IF_RANGE")


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
    note_step(svc, request.environ, hexdigest, started)
    return response


class WholeBlobs:
    """WSGI middleware: a plain GET of a stored blob, with the headers Flask's view sends."""

    def __init__(self, app, svc):
        self.app = app
        self.svc = svc

    def __call__(self, environ, start_response):
        started = time.monotonic()
        path = environ.get("PATH_INFO", "")
        hexdigest = path[len(PREFIX):]
        if (not path.startswith(PREFIX) or environ.get("REQUEST_METHOD") != "GET"
                or any(name in environ for name in CONDITIONS) or not HEX_RE.fullmatch(hexdigest)):
            return self.app(environ, start_response)
        try:
            handle = open(blob_file(self.svc.config, hexdigest), "rb")
        except OSError:
            return self.app(environ, start_response)  # its 404
        st = os.fstat(handle.fileno())
        note_step(self.svc, environ, hexdigest, started)
        start_response("200 OK", [
            ("Content-Type", "application/octet-stream"), ("Content-Length", str(st.st_size)),
            ("Content-Disposition", f"inline; filename={hexdigest}"),
            ("ETag", f'"sha256:{hexdigest}"'), ("Last-Modified", http_date(st.st_mtime)),
            ("Cache-Control", CACHE_CONTROL), ("Expires", http_date(time.time() + ONE_YEAR)),
            ("Accept-Ranges", "bytes")])
        return wrap_file(environ, handle)  # gunicorn's file wrapper: sendfile


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
