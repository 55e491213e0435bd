"""A node's overlays: shared and system for its boot (anyone may fetch them: no secrets), the
runtime one only for the node itself."""

from __future__ import annotations

import time

from flask import Blueprint, send_file
from werkzeug.http import http_date

from provisiond.api.services import client_address, log_step, services
from provisiond.errors import Forbidden, NotFound

bp = Blueprint("overlays", __name__)
KINDS = ("shared", "system", "runtime")
PREFIX = "/overlays/"


@bp.get("/overlays/<node>/<kind>")
def overlay(node: str, kind: str):
    started = time.monotonic()
    if kind not in KINDS:
        raise NotFound(f"no overlay kind {kind[:20]!r}; use shared, system or runtime")
    svc = services()
    record = svc.node(node)
    if kind == "runtime" and client_address() not in _addresses(record):
        raise Forbidden(f"the runtime overlay of {node} is served only to {node} itself")
    path = svc.overlays.path(node, kind)
    response = send_file(path, mimetype="application/octet-stream", conditional=True,
                         etag=svc.file_etag(path), max_age=0)
    response.cache_control.no_cache = True
    response.cache_control.private = kind == "runtime"
    log_step(node, f"{kind}-overlay", started)
    return response


def _addresses(node) -> set[str]:
    return {dev.ipaddr for dev in (node.record.netdevs or {}).values() if dev.ipaddr}


def whole_overlay(svc, environ: dict, rest: str) -> tuple | None:
    """For api.whole: a shared or system overlay's path and the view's headers (the
    runtime one, served to its node only, is left to the view)."""
    started = time.monotonic()
    node, _, kind = rest.partition("/")
    if kind not in ("shared", "system"):
        return None
    svc.node(node)
    path = svc.overlays.path(node, kind)
    return path, [("Content-Type", "application/octet-stream"),
                  ("Content-Disposition", f"inline; filename={path.name}"),
                  ("ETag", f'"{svc.file_etag(path)}"'), ("Cache-Control", "no-cache, max-age=0"),
                  ("Expires", http_date(time.time()))], \
        lambda: log_step(node, f"{kind}-overlay", started, environ)
