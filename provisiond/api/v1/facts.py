"""Node facts: `POST /api/v1/facts/<node>` (the node agent, with its node credential, on
every boot) and `GET /api/v1/nodes/<node>/facts` (readers): CPUs, memory, disks, NICs, DMI,
BMC as the node last reported them, with the report's time."""

from __future__ import annotations

from pydantic import BaseModel

from provisiond.api.services import require_credential, services
from provisiond.api.v1 import Name, Role, config, route
from provisiond.discovery.facts import Facts, NodeFacts
from provisiond.service import discovery


class NodeName(BaseModel):
    node: Name


@route("/facts/<node>", "POST", role=None, summary="A node reports its hardware facts (with "
       "its node credential: Authorization: Bearer)", body=Facts, response=NodeFacts,
       nodes=True, path=NodeName, errors=(401, 403))
def report_facts(principal, body: Facts, query, node: str):
    require_credential(services().node(node))
    return discovery.node_reported(config(), node, body)


@route("/nodes/<node>/facts", "GET", role=Role.READER, summary="A node's last reported "
       "hardware facts and their time", response=NodeFacts, path=NodeName)
def node_facts(principal, body, query, node: str):
    return discovery.node_facts(config(), node)
