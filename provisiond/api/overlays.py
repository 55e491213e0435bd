"""A node's overlays: shared and system for its boot (anyone may fetch them: no secrets), the
runtime one only with the node's credential, from one of its addresses."""

from __future__ import annotations

import logging
import time

from flask import Blueprint, request, send_file
from werkzeug.http import http_date

from provisiond.api.services import client_address, log_step, require_credential, services
from provisiond.discovery.limits import AddressWindow
from provisiond.errors import (BuildFailed, InvalidInput, NodeNotFound, NotFound,
                               OverlayNotFound, ProvisiondError)
from provisiond.states import NodePhase

log = logging.getLogger("provisiond.boot")
bp = Blueprint("overlays", __name__)
KINDS = ("shared", "system", "runtime")
# the overlay's own faults, which a retry does not mend (OverlayUnavailable, a NotFound too,
# is a build replaced while it was asked for: the retry gets the new one)
OVERLAY_FAULTS = (BuildFailed, InvalidInput, OverlayNotFound)
# overlay failures not recorded as a node's phase: a warning a second (per worker) at most
_WARNINGS = AddressWindow(limit=1, window=1.0, addresses=1)
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
    iPXE script retries), logged, and for a booting node recorded as its failed phase."""
    try:
        return svc.overlays.path(node, kind)
    except NodeNotFound:
        raise
    except ProvisiondError as exc:
        _failed(svc, node, kind, exc)
        raise


def _failed(svc, node: str, kind: str, exc: ProvisiondError) -> None:
    """A node booting, its own address asking for its shared or system part, whose overlay
    cannot be built (its template, overlay.yaml, a missing overlay) is `failed` with the
    reason, as a warning (once per phase writer's quiet time for the node). Nobody else's
    request changes the node's phase, nor does a runtime overlay the agent of a running node
    refreshes (the agent reports a failed fetch at boot itself) or a passing error (a build
    replaced meanwhile, the store away): those are logged, a warning a second at most."""
    asker = svc.table.node_for_ip(client_address(request.environ))
    booting = (kind != "runtime" and isinstance(exc, OVERLAY_FAULTS)
               and asker is not None and asker.name == node)
    if booting and svc.phases.record(node, NodePhase.FAILED, f"{kind} overlay: {exc}"):
        log.warning("%s %s-overlay failed: %s", node, kind, exc)
    elif _WARNINGS.allow("overlays", time.monotonic()):
        log.warning("%s %s-overlay failed (asked by %s): %s", node, kind,
                    client_address(request.environ), exc)
    else:
        log.debug("%s %s-overlay failed: %s", node, kind, exc)



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
