"""The status page at `/`: plain HTML, JavaScript and CSS beside this file, no build step.

The page itself holds no data: its script reads the API (status, nodes, images, the event
stream) with the reader token the user gives it, kept in the tab's sessionStorage.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, send_file

from provisiond.errors import NotFound

bp = Blueprint("page", __name__)
HERE = Path(__file__).resolve().parent
# Bare types: send_file adds "; charset=utf-8" to a text/ type (given here, it came twice).
ASSETS = {"status.js": "text/javascript", "status.css": "text/css"}
# Only this server's own files, no inline script: a node name or detail that reaches the page
# is text, never code.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
          "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@bp.get("/")
def index():
    return _send("index.html", "text/html")


@bp.get("/page/<name>")
def asset(name: str):
    if name not in ASSETS:
        raise NotFound(f"no page file {name[:40]!r}")
    return _send(name, ASSETS[name])


def _send(name: str, mimetype: str):
    """One of the page's files, revalidated on each load (an upgrade shows at once)."""
    response = send_file(HERE / name, mimetype=mimetype, conditional=True, max_age=0)
    response.headers["Content-Security-Policy"] = POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
