"""`/api/v1/discovery`: MAC addresses that asked for DHCP and are no node's (readers)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Page, Role, SeqCursor, config, route
from provisiond.service.discovery import list_discovery
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT


class Discovered(BaseModel):
    model_config = ConfigDict(extra="allow")

    time: float = Field(description="Unix time")
    mac: str


class DiscoveryQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mac: str | None = Field(None, pattern="^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$",
                            description="only this MAC's records")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: SeqCursor | None = Field(None, alias="continue")


@route("/discovery", "GET", role=Role.READER, summary="Unknown MACs seen asking for DHCP",
       query=DiscoveryQuery, response=Page[Discovered])
def discovery(principal, body, query: DiscoveryQuery):
    items, cursor = list_discovery(config(), query.mac, limit=query.limit,
                                   after=query.continue_)
    return {"items": items, "continue": cursor}
