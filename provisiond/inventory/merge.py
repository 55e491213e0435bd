"""Profile merge: a node's effective record, with which profile set each field.

The node's own value wins, then its profiles from right to left; lists append (profiles in
order, then the node, without repeats); mappings merge key by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisiond.inventory.model import Inventory, NetDev, Record

NODE_SOURCE = "node"


@dataclass(frozen=True)
class Node:
    """A node's effective record after the merge, and where each field came from."""

    name: str
    record: Record
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def primary_netdev(self) -> tuple[str, NetDev] | None:
        """The netdev marked primary, else the first one by name."""
        netdevs = self.record.netdevs or {}
        for name in sorted(netdevs):
            if netdevs[name].primary:
                return name, netdevs[name]
        return next(((n, netdevs[n]) for n in sorted(netdevs)), None)

    @property
    def ipaddr(self) -> str | None:
        primary = self.primary_netdev
        return primary[1].ipaddr if primary else None

    @property
    def macs(self) -> list[str]:
        return [d.mac for _, d in sorted((self.record.netdevs or {}).items()) if d.mac]

    @property
    def addresses(self) -> list[str]:
        """Every address reserved for the node, IPv4 and IPv6, sorted."""
        return sorted({a for d in (self.record.netdevs or {}).values()
                       for a in (d.ipaddr, d.ipaddr6) if a})

    def to_data(self) -> dict:
        return {"name": self.name, **self.record.to_data()}


def merge_node(inventory: Inventory, name: str, profile_data: dict | None = None) -> Node:
    """Merge node `name` with its profiles (which must exist; see validate).

    `profile_data` (profile name -> plain data) saves dumping each profile once per node."""
    record = inventory.nodes[name]
    if profile_data is None:
        profile_data = {p: inventory.profiles[p].to_data()
                        for p in record.profiles or [] if p in inventory.profiles}
    layers = [(f"profile:{p}", profile_data[p])
              for p in record.profiles or [] if p in profile_data]
    layers.append((NODE_SOURCE, record.to_data()))
    merged: dict = {}
    provenance: dict[str, str] = {}
    for source, data in layers:
        _merge_into(merged, data, source, provenance, "")
    return Node(name=name, record=Record.model_validate(merged), provenance=provenance)


def merge_all(inventory: Inventory) -> dict[str, Node]:
    return merge_nodes(inventory, list(inventory.nodes))


def merge_nodes(inventory: Inventory, names: list[str]) -> dict[str, Node]:
    """The named nodes merged, each profile dumped once for all of them."""
    profile_data = {name: record.to_data() for name, record in inventory.profiles.items()}
    return {name: merge_node(inventory, name, profile_data) for name in names}


def _merge_into(target: dict, data: dict, source: str, provenance: dict, prefix: str) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            _merge_into(target.setdefault(key, {}), value, source, provenance, f"{path}.")
        elif isinstance(value, list) and key != "profiles":
            existing = target.setdefault(key, [])
            existing.extend(v for v in value if v not in existing)
            previous = provenance.get(path)
            provenance[path] = source if not previous else f"{previous},{source}"
        else:
            target[key] = value
            provenance[path] = source
