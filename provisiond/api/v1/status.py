"""`/api/v1/status`: each node's boot phase and when it reached each phase (readers).
Nodes report their phases with `POST /api/v1/status/<node>` (api/status.py), open to them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Page, Role, config, route
from provisiond.service import status
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT
from provisiond.states import NodePhase


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
