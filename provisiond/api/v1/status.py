"""`/api/v1/status`: each node's boot phase and when it reached each phase (readers); nodes
report their phases with `POST /api/v1/status/<node>`, open to them with their node
credential (the node agent; provisiond.trust)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.services import require_credential, services
from provisiond.api.v1 import Name, NameCursor, NodeRange, Page, Role, config, route
from provisiond.errors import InvalidInput
from provisiond.service import status
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT
from provisiond.states import NodePhase
from provisiond.status import record_phase

SEEN_BY_SERVER = (NodePhase.DHCP, NodePhase.IPXE, NodePhase.KERNEL)
REPORTED = ", ".join(p.value for p in NodePhase if p not in SEEN_BY_SERVER)


class NodeStatus(BaseModel):
    node: str
    phase: NodePhase | None = Field(description="the last phase reached; null: no report")
    phases: dict[str, float] = Field(description="phase -> Unix time, this boot")
    boot_started: float | None
    updated: float | None
    detail: str | None
    token_refused: dict | None = Field(None, description="the last refused provisioning "
                                       "token: time, reason, address")
    memory: dict[str, int] | None = Field(None, description="the node's memory at its last "
                                          "report: total_kib, available_kib (/proc/meminfo)")


class StatusQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    names: NodeRange | None = Field(None, description="a node range: only these")
    phase: NodePhase | None = Field(None, description="only nodes in this phase")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: NameCursor | None = Field(None, alias="continue")


class NodeName(BaseModel):
    node: Name


@route("/status", "GET", role=Role.READER, summary="Nodes' boot status", query=StatusQuery,
       response=Page[NodeStatus])
def list_status(principal, body, query: StatusQuery):
    items, cursor = status.list_status(config(), query.names,
                                       query.phase.value if query.phase else None,
                                       limit=query.limit, after=query.continue_)
    return {"items": items, "continue": cursor}


@route("/status/<node>", "GET", role=Role.READER, summary="A node's boot status",
       response=NodeStatus, path=NodeName)
def node_status(principal, body, query, node: str):
    return status.node_status(config(), node)


class PhaseReport(BaseModel):
    """What the node agent sends (a form or JSON); other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    phase: NodePhase
    detail: str = Field("", description="cut to 500 characters")
    mem_total_kib: int | None = Field(None, ge=0, description="MemTotal of /proc/meminfo")
    mem_available_kib: int | None = Field(None, ge=0, description="MemAvailable")


@route("/status/<node>", "POST", role=None, summary="A node reports a boot phase (with its "
       "node credential: Authorization: Bearer)", body=PhaseReport, forms=True,
       response=NodeStatus, nodes=True, path=NodeName, errors=(401, 403))
def report(principal, body: PhaseReport, query, node: str):
    """booted, runtime, configured, ready or failed; dhcp, ipxe and kernel are recorded from
    what the server sees, never from a report."""
    require_credential(services().node(node))  # the boot table's nodes: no file read
    if body.phase in SEEN_BY_SERVER:
        raise InvalidInput(f"phase {body.phase.value} is recorded by the server itself; a "
                           f"node reports one of: {REPORTED}", field="phase")
    memory = {k: v for k, v in (("total_kib", body.mem_total_kib),
                                ("available_kib", body.mem_available_kib)) if v is not None}
    return status.status_document(node, record_phase(config(), node, body.phase,
                                                     body.detail[:500], memory))
