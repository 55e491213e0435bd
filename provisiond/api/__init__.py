"""The HTTP side of provisiond: a Flask app factory, one blueprint per area.

Every error answer has one shape, `{"error": {"code": slug, "message": text, "field": dotted
name or null}}`: a ProvisiondError with its `http_status` and `code`, any other HTTP error
with its status and a slug of its name, so no request ever sees a traceback.
"""

from __future__ import annotations

import logging
import os

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from provisiond.api.services import BootServices
from provisiond.config import Config, load_config, resolve_state_dir
from provisiond.errors import ProvisiondError

log = logging.getLogger("provisiond.api")
MAX_BODY = 64 << 10  # the largest body any endpoint reads (a status report is ~100 bytes)


def create_app(config: Config, listener: str = "all") -> Flask:
    """The provisiond HTTP app for `config`: boot, blobs, overlays, status, /api/v1, /metrics
    and the status page. `listener` boot or api answers only that listener's routes
    (provisiond.api.listeners)."""
    from provisiond.api import blobs, boot, listeners, metrics, overlays, page, v1
    from provisiond.api.whole import WholeFiles

    app = Flask("provisiond", static_folder=None)
    app.config["PROVISIOND"] = config
    app.config["PROVISIOND_LISTENER"] = listener
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY  # larger bodies: 413, never read
    app.extensions["provisiond"] = BootServices(config)
    for module in (boot, blobs, overlays, metrics, page):
        app.register_blueprint(module.bp)
    app.register_blueprint(v1.blueprint())
    app.before_request(listeners.refuse_other_listeners_routes)
    app.before_request(metrics.note_route)  # a route refused above counts as unmatched
    if listener != "api":  # it answers blobs and overlays ahead of the hook above
        app.wsgi_app = WholeFiles(app.wsgi_app, app.extensions["provisiond"])
    app.register_error_handler(ProvisiondError, _provisiond_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    return app


def create_app_from_env() -> Flask:
    """For gunicorn: the state dir comes from $PROVISIOND_STATE_DIR, the listener's role
    from $PROVISIOND_LISTENER (all, boot or api)."""
    from provisiond.boot.logs import setup_logging_from_env
    from provisiond.boot.supervisor import LISTENER_ENV

    setup_logging_from_env()
    return create_app(load_config(resolve_state_dir(None)), os.environ.get(LISTENER_ENV, "all"))


# Slugs for HTTP errors werkzeug raises itself (routing, body size, parsing).
STATUS_CODES = {400: "invalid_input", 401: "unauthenticated", 403: "forbidden",
                404: "not_found", 405: "method_not_allowed", 409: "conflict",
                412: "precondition_failed", 413: "too_large", 415: "unsupported_media_type",
                500: "internal"}


def error_document(code: str, message: str, field: str | None = None) -> dict:
    """The one error shape of every answer of the app (and of gunicorn's own, worker.py)."""
    return {"error": {"code": code, "message": message, "field": field}}


def status_slug(status: int, reason: str) -> str:
    """The `code` of an HTTP error: 413 too_large, else the reason as a slug."""
    return STATUS_CODES.get(status) or "_".join(reason.lower().replace("-", " ").split())


def error_body(message: str, code: str, status: int, field: str | None = None):
    return jsonify(error_document(code, message, field)), status


def _provisiond_error(exc: ProvisiondError):
    body, status = error_body(str(exc), exc.code, exc.http_status, exc.field)
    if status == 401:
        body.headers["WWW-Authenticate"] = 'Bearer realm="provisiond"'
    return body, status


def _http_error(exc: HTTPException):
    response = exc.get_response()
    if exc.code is not None and exc.code < 400:
        return response
    status = exc.code or 500
    body, status = error_body(exc.description or exc.name, status_slug(status, exc.name), status)
    for header in ("Allow", "Content-Range", "Retry-After"):
        if header in response.headers:
            body.headers[header] = response.headers[header]
    return body, status


def _unexpected_error(exc: Exception):
    log.exception("unexpected error")
    return error_body("internal error", "internal", 500)
