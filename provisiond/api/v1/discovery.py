"""`/api/v1/discovery`: discovered machines (readers), their approval and rejection
(admins), the rules, the DHCP sightings of unknown MACs; and the two open routes the
discovery image calls: its fact report and its poll for what to do next.

The open routes take untrusted input: the body is validated and bounded (provisiond.
discovery.facts), each source address may call them `discovery.reports_per_minute` times a
minute per worker (then 429), and the queue of waiting machines is bounded
(provisiond.discovery.machines).
"""

from __future__ import annotations

import time

from flask import current_app
from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.services import client_address, services
from provisiond.api.v1 import NodeRange, Page, Role, SeqCursor, config, route
from provisiond.boot.discovery import enlisting
from provisiond.discovery.facts import Facts, Mac
from provisiond.discovery.limits import AddressWindow
from provisiond.discovery.machines import Machine, MachineState
from provisiond.discovery.rules import Rule
from provisiond.errors import NotFound, TooManyRequests
from provisiond.service import discovery
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT

MAC_PATTERN = "^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$"
MAX_MACS = 10_000


class MachinesQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    state: MachineState | None = Field(None, description="only machines in this state")
    mac: str | None = Field(None, pattern=MAC_PATTERN, description="only this MAC")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: SeqCursor | None = Field(None, alias="continue")


class MachinePath(BaseModel):
    mac: str = Field(pattern=MAC_PATTERN)


class Approval(BaseModel):
    """Names (and addresses) from a sequence for the chosen machines: the named ones in
    that order, else every pending one in discovery order, or sorted by a fact."""

    model_config = ConfigDict(extra="forbid")

    macs: list[str] | None = Field(None, max_length=MAX_MACS)
    names: NodeRange
    ipaddr: str | None = Field(None, max_length=45, description="the first name's address")
    profile: str | None = Field(None, max_length=63)
    sort: str | None = Field(None, max_length=32, description="a fact name: dmi.serial...")
    netdev: str = Field("eth0", pattern=r"^[^\s/:]{1,15}$")
    gateway: str | None = Field(None, max_length=45)


class Rejection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    macs: list[str] = Field(min_length=1, max_length=MAX_MACS)


class Machines(BaseModel):
    items: list[Machine]


class Rules(BaseModel):
    items: list[Rule]


class Report(BaseModel):
    """What the discovery image sends: its boot MAC and its facts."""

    model_config = ConfigDict(extra="forbid")

    mac: Mac
    facts: Facts


class Action(BaseModel):
    action: str = Field(description="wait (ask again later), reboot (as `node`), poweroff "
                        "(rejected) or report (send the facts again)")
    node: str | None = None
    retry: int = Field(10, description="seconds to wait before asking again")


@route("/discovery", "GET", role=Role.READER, summary="Discovered machines",
       query=MachinesQuery, response=Page[Machine])
def list_machines(principal, body, query: MachinesQuery):
    items, cursor = discovery.list_machines(
        config(), query.state.value if query.state else None, query.mac, limit=query.limit,
        after=query.continue_)
    return {"items": [m.model_dump(mode="json") for m in items], "continue": cursor}


@route("/discovery/machines/<mac>", "GET", role=Role.READER, summary="A discovered machine",
       response=Machine, path=MachinePath)
def show_machine(principal, body, query, mac: str):
    return discovery.get_machine(config(), mac)


@route("/discovery/approve", "POST", role=Role.ADMIN, summary="Approve machines as nodes "
       "named (and addressed) from a sequence", body=Approval, response=Machines,
       errors=(404, 409, 422))
def approve(principal, body: Approval, query):
    approved = discovery.approve(config(), f"token:{principal.name}", body.macs, body.names,
                                 body.ipaddr, body.profile, sort=body.sort,
                                 netdev=body.netdev, gateway=body.gateway)
    return {"items": [m.model_dump(mode="json") for m in approved]}


@route("/discovery/reject", "POST", role=Role.ADMIN, summary="Reject machines (they power "
       "off)", body=Rejection, response=Machines, errors=(404,))
def reject(principal, body: Rejection, query):
    rejected = discovery.reject(config(), f"token:{principal.name}", body.macs)
    return {"items": [m.model_dump(mode="json") for m in rejected]}


@route("/discovery/rules", "GET", role=Role.READER, summary="The discovery rules",
       response=Rules)
def rules(principal, body, query):
    return {"items": [r.model_dump() for r in discovery.check_rules(config())]}


class SightingsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mac: str | None = Field(None, pattern=MAC_PATTERN, description="only this MAC's records")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: SeqCursor | None = Field(None, alias="continue")


class Sighting(BaseModel):
    model_config = ConfigDict(extra="allow")

    time: float = Field(description="Unix time")
    mac: str


@route("/discovery/sightings", "GET", role=Role.READER, summary="Unknown MACs seen asking "
       "for DHCP", query=SightingsQuery, response=Page[Sighting])
def sightings(principal, body, query: SightingsQuery):
    items, cursor = discovery.list_sightings(config(), query.mac, limit=query.limit,
                                             after=query.continue_)
    return {"items": items, "continue": cursor}


def limited() -> str:
    """The caller's address, if discovery is on (else 404) and the address has calls left
    this minute (per worker; else 429)."""
    if not enlisting(config()):
        raise NotFound("discovery is off (dhcp.discovery and discovery.pool)")
    address = client_address()
    window = current_app.extensions.get("provisiond.discovery")
    if window is None:
        window = current_app.extensions["provisiond.discovery"] = AddressWindow(
            config().discovery.reports_per_minute, 60.0)
    if not window.allow(address, time.monotonic()):
        raise TooManyRequests(f"{address}: more than {window.limit} discovery calls a "
                              "minute; wait")
    return address


@route("/discovery/reports", "POST", role=None, summary="The discovery image reports a "
       "machine's facts", body=Report, response=Action, nodes=True, errors=(404, 429, 503))
def report(principal, body: Report, query):
    """Open to machines on the boot network; bounded per address and in all."""
    address = limited()
    known = _node_of(body.mac)
    machine = discovery.report(config(), body.mac, address, body.facts, known)
    node = machine.node if machine and machine.state is MachineState.APPROVED else None
    return Action(**discovery.next_action(config(), body.mac, node or known))


@route("/discovery/machines/<mac>/action", "GET", role=None, summary="What a discovered "
       "machine should do next", response=Action, nodes=True, path=MachinePath,
       errors=(404, 429))
def action(principal, body, query, mac: str):
    limited()
    mac = discovery.check_mac(mac)
    return Action(**discovery.next_action(config(), mac, _node_of(mac)))


def _node_of(mac: str) -> str | None:
    entry = services().table.by_mac.get(mac)
    return entry.node if entry else None
