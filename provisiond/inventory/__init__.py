"""The inventory of nodes and profiles: schema, merge, ranges, atomic store, secrets."""

from provisiond.config import Config
from provisiond.inventory.merge import Node, merge_all
from provisiond.inventory.store import InventoryStore


def load_nodes(config: Config) -> dict[str, Node]:
    """Every node's merged record, keyed by name."""
    return merge_all(InventoryStore(config).read())


__all__ = ["Node", "InventoryStore", "load_nodes"]
