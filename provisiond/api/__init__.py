"""The HTTP side of provisiond: a Flask app factory, one blueprint per area.

Every ProvisiondError becomes `{"error": ..., "type": ...}` with its `http_status`; any other
HTTP error keeps its code with the same JSON shape, so no request ever sees a traceback.
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


def create_app(config: Config) -> Flask:
    """The provisiond HTTP app for `config`: boot, blobs, overlays and status endpoints."""
    from provisiond.api import blobs, boot, overlays, status
    from provisiond.api.whole import WholeFiles

    app = Flask("provisiond", static_folder=None)
    app.config["PROVISIOND"] = config
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY  # larger bodies: 413, never read
    app.extensions["provisiond"] = BootServices(config)
    for module in (boot, blobs, overlays, status):
        app.register_blueprint(module.bp)
    app.wsgi_app = WholeFiles(app.wsgi_app, app.extensions["provisiond"])
    app.register_error_handler(ProvisiondError, _provisiond_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    return app


def create_app_from_env() -> Flask:
    """For gunicorn: the state dir comes from $PROVISIOND_STATE_DIR."""
    from provisiond.boot.logs import setup_logging

    setup_logging(os.environ.get("PROVISIOND_LOG_LEVEL", "INFO"))
    return create_app(load_config(resolve_state_dir(None)))


def error_body(message: str, kind: str, status: int):
    return jsonify(error=message, type=kind), status


def _provisiond_error(exc: ProvisiondError):
    return error_body(str(exc), type(exc).__name__, exc.http_status)


def _http_error(exc: HTTPException):
    response = exc.get_response()
    if exc.code is not None and exc.code < 400:
        return response
    body, status = error_body(exc.description or exc.name, type(exc).__name__, exc.code or 500)
    for header in ("Allow", "Content-Range", "Retry-After"):
        if header in response.headers:
            body.headers[header] = response.headers[header]
    return body, status


def _unexpected_error(exc: Exception):
    log.exception("unexpected error")
    return error_body("internal error", "InternalError", 500)
