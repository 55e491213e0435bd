"""Whole files in front of Flask: the boot storm's most frequent requests.

A node's boot fetches blobs (kernel, layers) and its shared and system overlays in full,
without a condition. Through Flask's `send_file`, each cost 300-500 µs of CPU; answered here
(the same headers, boot steps and phases), 30-50 µs, which on 2 cores decides how a storm
compares with nginx. Anything else (a Range, an If-None-Match, a runtime overlay, any
error) goes on to Flask's views, which remain the whole definition of these endpoints.
"""

from __future__ import annotations

import os
import time

from werkzeug.http import http_date, parse_range_header
from werkzeug.wsgi import wrap_file

from provisiond.api import blobs, overlays
from provisiond.api.metrics import ROUTE_KEY, STARTED_KEY

CONDITIONS = ("HTTP_RANGE", "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_MATCH",
              "HTTP_IF_UNMODIFIED_SINCE", "HTTP_IF_RANGE")


class WholeFiles:
    """WSGI middleware: plain GETs of blobs and shared/system overlays, sent with sendfile."""

    def __init__(self, app, svc):
        self.app = app
        self.svc = svc

    def __call__(self, environ, start_response):
        environ[STARTED_KEY] = time.monotonic()  # the outermost app: for the request's metrics
        _drop_unusable_range(environ)
        found = None
        if environ.get("REQUEST_METHOD") == "GET" and not any(c in environ for c in CONDITIONS):
            found = self._find(environ)
        if found is None:
            return self.app(environ, start_response)
        path, headers, note_step, route = found
        try:
            handle = open(path, "rb")
        except OSError:
            return self.app(environ, start_response)  # not there: the view's 404
        note_step()
        environ[ROUTE_KEY] = route
        st = os.fstat(handle.fileno())
        start_response("200 OK", [("Content-Length", str(st.st_size)),
                                  ("Last-Modified", http_date(st.st_mtime)),
                                  ("Accept-Ranges", "bytes"), *headers])
        return wrap_file(environ, handle)  # gunicorn's file wrapper: sendfile

    def _find(self, environ) -> tuple | None:
        """(path, headers, note_step, route) from the endpoint's module, or None for Flask."""
        path = environ.get("PATH_INFO", "")
        for module, find in ((blobs, blobs.whole_blob), (overlays, overlays.whole_overlay)):
            if path.startswith(module.PREFIX):
                try:
                    found = find(self.svc, environ, path[len(module.PREFIX):])
                except Exception:  # noqa: BLE001 - the view answers it again: its status, log
                    return None
                return None if found is None else (*found, module.RULE)
        return None


def _drop_unusable_range(environ: dict) -> None:
    """RFC 9110 14.2: a Range in a unit other than bytes must be ignored, and one of several
    ranges may be; both get the whole file (werkzeug answers them 416, which says that no
    range overlaps the file)."""
    value = environ.get("HTTP_RANGE")
    if value is None:
        return
    parsed = parse_range_header(value)
    if parsed is None or parsed.units != "bytes" or len(parsed.ranges) != 1:
        del environ["HTTP_RANGE"]
