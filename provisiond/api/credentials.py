"""`POST /api/v1/credentials/<node>`: a node's agent trades its provisioning token (from the
kernel command line) for its node credential, once per boot."""

from __future__ import annotations

from flask import Blueprint, Response

from provisiond.api.services import client_address, client_port, form_fields, services
from provisiond.trust import TokenRefused, exchange

bp = Blueprint("credentials", __name__, url_prefix="/api/v1/credentials")


@bp.post("/<node>")
def exchange_token(node: str):
    """Form or JSON body: token=<provisioning token>. Answers the credential as one line of
    text (a shell reads it without a JSON parser); a refusal is a 401 and an event."""
    svc = services()
    record = svc.node(node)
    text = str(form_fields().get("token") or "")
    try:
        credential = exchange(svc.config, record, text, client_address(), client_port())
    except TokenRefused as refused:
        svc.refusals.note(refused)
        raise
    response = Response(credential + "\n", content_type="text/plain; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response
