"""`/api/v1/audit`: who changed what, when, and which fields (admins)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Page, Role, SeqCursor, config, route
from provisiond.service.audit import read_audit
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT


class AuditEntry(BaseModel):
    seq: int
    time: float = Field(description="Unix time")
    actor: str = Field(description="token:NAME (API) or cli:USER")
    action: str = Field(description="e.g. node.create, node.patch, secret.set, token.revoke")
    target: str = Field(description="e.g. node:n[001-064]")
    changes: list | dict = Field(description="the changed fields' names (never a secret)")


class AuditQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    after: int = Field(0, ge=0, description="entries after this seq")
    actor: str | None = Field(None, max_length=200)
    target: str | None = Field(None, max_length=1000)
    action: str | None = Field(None, max_length=100)
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: SeqCursor | None = Field(None, alias="continue")


@route("/audit", "GET", role=Role.ADMIN, summary="The audit log, oldest first",
       query=AuditQuery, response=Page[AuditEntry])
def audit_log(principal, body, query: AuditQuery):
    items, cursor = read_audit(config(), after=query.after, limit=query.limit,
                               actor=query.actor, target=query.target, action=query.action,
                               cursor=query.continue_)
    return {"items": items, "continue": cursor}
