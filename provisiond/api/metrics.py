"""`GET /metrics` for Prometheus, and the HTTP requests it counts.

Every request is counted once its body is out (gunicorn's post_request hook calls
`observe_request`), labelled by the route that answered it (the URL rule, never the URL:
`/blobs/sha256/<hexdigest>`), so the labels stay few whatever clients ask for.
"""

from __future__ import annotations

import os
import time

from flask import Blueprint, Response, request

from provisiond.api.services import services
from provisiond.api.v1 import Role, authorize
from provisiond.metrics import MULTIPROC_ENV, FileCollector, count, live, observe

bp = Blueprint("metrics", __name__)
ROUTE_KEY = "provisiond.route"  # environ: the URL rule that answered (api.whole sets it too)
STARTED_KEY = "provisiond.started"  # environ: monotonic time the request reached the app
UNMATCHED = "unmatched"  # no route: a 404, a 405
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


@bp.get("/metrics")
def metrics():
    """The Prometheus text format: every process's live counters, and the recorded builds
    and BMC calls. Open unless `metrics.require_token`: then a reader token."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    config = services().config
    if config.metrics.require_token:
        authorize(Role.READER)
    registry = CollectorRegistry(auto_describe=False)
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        MultiProcessCollector(registry, path=directory)
    else:  # no serve (a test, a bare gunicorn): this process's own counters
        registry.register(live().registry)
    registry.register(FileCollector(config))
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def note_route() -> None:
    """Flask before_request: the URL rule that answers this request, for `observe_request`
    (and its start, unless api.whole in front of Flask took it earlier)."""
    rule = request.url_rule
    request.environ[ROUTE_KEY] = rule.rule if rule is not None else UNMATCHED
    request.environ.setdefault(STARTED_KEY, time.monotonic())


def observe_request(environ: dict, status: int, sent: int | None) -> None:
    """Count one answered request: by route, method and status; its bytes and seconds."""
    route = environ.get(ROUTE_KEY, UNMATCHED)
    method = environ.get("REQUEST_METHOD", "")
    count("http_requests", route, method if method in METHODS else "other", str(status))
    if sent:
        count("http_response_bytes", route, amount=sent)
    started = environ.get(STARTED_KEY)
    if started is not None:
        observe("http_request_duration_seconds", time.monotonic() - started, route)
