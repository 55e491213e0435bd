"""`/api/v1/nodes`: the inventory's nodes (see records.py for what each route does)."""

from provisiond.api.v1.records import NewNodes, NodeNames, NodeQuery, register
from provisiond.service.inventory import NODES

register(NODES, NodeQuery, NewNodes, NodeNames)
