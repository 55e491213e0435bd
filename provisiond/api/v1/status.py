"""`/api/v1/status`: each node's boot phase and when it reached each phase (readers); nodes
report their phases with `POST /api/v1/status/<node>`, open to them (the node agent)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.services import services
from provisiond.api.v1 import Page, Role, config, route
from provisiond.service import status
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT
from provisiond.states import NodePhase
from provisiond.status import record_phase


class NodeStatus(BaseModel):
    node: str
    phase: NodePhase | None = Field(description="the last phase reached; null: no report")
    phases: dict[str, float] = Field(description="phase -> Unix time, this boot")
    boot_started: float | None
    updated: float | None
    detail: str | None


class StatusQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    names: str | None = Field(None, description="a node range: only these", max_length=1000)
    phase: NodePhase | None = Field(None, description="only nodes in this phase")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: str | None = Field(None, alias="continue", max_length=500)


@route("/status", "GET", role=Role.READER, summary="Nodes' boot status", query=StatusQuery,
       response=Page[NodeStatus])
def list_status(principal, body, query: StatusQuery):
    items, cursor = status.list_status(config(), query.names,
                                       query.phase.value if query.phase else None,
                                       limit=query.limit, after=query.continue_)
    return {"items": items, "continue": cursor}


@route("/status/<node>", "GET", role=Role.READER, summary="A node's boot status",
       response=NodeStatus)
def node_status(principal, body, query, node: str):
    return status.node_status(config(), node)


class PhaseReport(BaseModel):
    """What the node agent sends (a form or JSON); other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    phase: NodePhase
    detail: str = Field("", description="cut to 500 characters")


@route("/status/<node>", "POST", role=None, summary="A node reports a boot phase (open to "
       "nodes)", body=PhaseReport, forms=True, response=NodeStatus)
def report(principal, body: PhaseReport, query, node: str):
    services().node(node)  # the boot table's nodes: the server's view, without a file read
    return status.status_document(node, record_phase(config(), node, body.phase,
                                                     body.detail[:500]))
