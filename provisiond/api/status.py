"""Boot phases: the node agent reports them here, open to nodes (operators read them
through /api/v1/status, api/v1/status.py)."""

from __future__ import annotations

from flask import Blueprint, jsonify, request

from provisiond.api.services import services
from provisiond.errors import InvalidInput
from provisiond.states import NodePhase

bp = Blueprint("status", __name__, url_prefix="/api/v1/status")
PHASES = ", ".join(p.value for p in NodePhase)


@bp.post("/<node>")
def report(node: str):
    """Form or JSON body: phase=<NodePhase value>, detail=<text>."""
    from provisiond.status import record_phase

    svc = services()
    svc.node(node)
    body = request.get_json(silent=True) if request.is_json else request.form
    if not isinstance(body, dict) and not hasattr(body, "get"):
        raise InvalidInput("send phase=... as a form or a JSON object")
    try:
        phase = NodePhase(str(body.get("phase", "")))
    except ValueError:
        raise InvalidInput(f"phase must be one of: {PHASES}") from None
    detail = str(body.get("detail") or "")[:500]
    return jsonify(record_phase(svc.config, node, phase, detail))
