"""A node's overlays: shared and system for its boot (anyone may fetch them: no secrets), the
runtime one only with the node's credential, from one of its addresses."""

from __future__ import annotations

import logging
import time

from flask import Blueprint, send_file
from werkzeug.http import http_date

from provisiond.api.services import log_step, require_credential, services
from provisiond.errors import NodeNotFound, NotFound, ProvisiondError
from provisiond.states import NodePhase

log = logging.getLogger("provisiond.boot")
bp = Blueprint("overlays", __name__)
KINDS = ("shared", "system", "runtime")
PREFIX = "/overlays/"
RULE = PREFIX + "<node>/<kind>"


@bp.get(RULE)
def overlay(node: str, kind: str):
    started = time.monotonic()
    if kind not in KINDS:
        raise NotFound(f"no overlay kind {kind[:20]!r}; use shared, system or runtime")
    svc = services()
    record = svc.node(node)
    if kind == "runtime":
        require_credential(record)
    path = _built(svc, node, kind)
    response = send_file(path, mimetype="application/octet-stream", conditional=True,
                         etag=svc.file_etag(path), max_age=0)
    response.cache_control.no_cache = True
    response.cache_control.private = kind == "runtime"
    log_step(node, f"{kind}-overlay", started)
    return response


def _built(svc, node: str, kind: str):
    """The node's `kind` overlay; one that cannot be built fails the request (the node's
    iPXE script retries) with its reason in the log and as the node's failed phase."""
    try:
        return svc.overlays.path(node, kind)
    except NodeNotFound:
        raise
    except ProvisiondError as exc:
        log.warning("%s %s-overlay failed: %s", node, kind, exc)
        svc.phases.record(node, NodePhase.FAILED, f"{kind} overlay: {exc}")
        raise


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
