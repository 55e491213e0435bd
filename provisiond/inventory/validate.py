"""Whole-inventory checks that one record's schema cannot make: references, uniqueness,
addresses inside their network and not the server's own."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from provisiond.config import Config
from provisiond.errors import InvalidInventory
from provisiond.inventory.merge import Node, merge_all, merge_nodes
from provisiond.inventory.model import Inventory, Record, check_name
from provisiond.inventory.values import bmc_port
from provisiond.states import BmcDriver


def validate_inventory(inventory: Inventory, config: Config | None = None) -> dict[str, Node]:
    """Raise InvalidInventory naming the first problem; return the merged nodes if none.
    With `config`, a node may not have the server's own address, nor a loopback one unless
    the server's is loopback too (a server on loopback, as in tests and demos, is reached by
    loopback clients only; anywhere else a loopback node address is a mistake, and would
    hand the node's runtime overlay to any local process)."""
    return check_inventory(inventory, config)[0]


def check_inventory(inventory: Inventory, config: Config | None = None
                    ) -> tuple[dict[str, Node], Claims]:
    """validate_inventory, also returning who claims each MAC, address and BMC endpoint
    (what check_changes needs to check a later change of a few nodes)."""
    _check_names(inventory.profiles, "profile")
    _check_names(inventory.nodes, "node")
    for name, profile in inventory.profiles.items():
        if profile.profiles:
            raise InvalidInventory(f"profile {name}: profiles: a profile cannot list profiles")
    _check_profiles_exist(inventory, inventory.nodes)
    nodes = merge_all(inventory)
    claims = Claims.for_server(config)
    for node in nodes.values():
        _check_node(node, claims)
    return nodes, claims


def check_changes(inventory: Inventory, claims: Claims, names: Iterable[str]) -> Claims:
    """Check an inventory in which only the nodes `names` were added, replaced or removed
    since a valid one whose `claims` are given (made with the same config; its profiles
    unchanged): what
    check_inventory would find, looking at those nodes alone. Returns the new claims; the
    given ones are left as they were.

    Every rule check_inventory applies is either about one node (its name, profiles,
    networks) or about a pair of nodes (a MAC, an address or a BMC endpoint used twice); in
    a valid inventory every pair of unchanged nodes passed already, so a problem can only
    involve a changed node: each is checked, and claims what it uses against the claims
    of the others."""
    names = list(dict.fromkeys(names))
    present = {name: inventory.nodes[name] for name in names if name in inventory.nodes}
    _check_names(present, "node")
    _check_profiles_exist(inventory, present)
    claims = claims.without(names)
    for node in merge_nodes(inventory, list(present)).values():
        _check_node(node, claims)
    return claims


@dataclass
class Claims:
    """Which node holds each MAC, each address (IPv4 and IPv6 together, with the server's
    own) and each BMC endpoint of a valid inventory, and what each node holds."""

    loopback_ok: bool = True
    held: dict[tuple[str, object], str] = field(default_factory=dict)
    """(what, value) -> its holder: "node NAME" or "the server (server.address)" """
    by_node: dict[str, list[tuple[str, object]]] = field(default_factory=dict)

    @classmethod
    def for_server(cls, config: Config | None) -> "Claims":
        claims = cls()
        if config is not None:
            server = ipaddress.ip_address(config.server.address)
            claims.held[("ip", str(server))] = "the server (server.address)"
            claims.loopback_ok = server.is_loopback
        return claims

    def without(self, names: list[str]) -> "Claims":
        """A copy in which the nodes `names` hold nothing."""
        held, by_node = dict(self.held), dict(self.by_node)
        for name in names:
            for key in by_node.pop(name, ()):
                if held.get(key) == f"node {name}":
                    del held[key]
        return Claims(self.loopback_ok, held, by_node)

    def to_json(self) -> dict:
        """A form json.dumps takes (from_json reads it back): by_node follows from held."""
        return {"loopback_ok": self.loopback_ok,
                "held": [[what, list(value) if isinstance(value, tuple) else value, holder]
                         for (what, value), holder in self.held.items()]}

    @classmethod
    def from_json(cls, data) -> "Claims":
        """to_json's form back (a BMC endpoint's list a tuple again); ValueError, TypeError
        or KeyError for anything else."""
        claims = cls(loopback_ok=data["loopback_ok"])
        if not isinstance(claims.loopback_ok, bool):
            raise ValueError("loopback_ok: not a boolean")
        for what, value, holder in data["held"]:
            key = (str(what), tuple(value) if isinstance(value, list) else value)
            hash(key)  # TypeError for a mapping where a value should be
            claims.held[key] = str(holder)
            if holder.startswith("node "):
                claims.by_node.setdefault(holder[len("node "):], []).append(key)
        return claims

    def claim(self, what: str, value, node: str, field: str, shown: str | None = None
              ) -> None:
        """Record that `node` uses `value`; InvalidInventory if another holds it."""
        if value is None:
            return
        holder = self.held.setdefault((what, value), f"node {node}")
        if holder != f"node {node}":
            raise InvalidInventory(
                f"node {node}: {field}: {shown or value} is already used by {holder}")
        self.by_node.setdefault(node, []).append((what, value))


def _check_profiles_exist(inventory: Inventory, nodes: dict[str, Record]) -> None:
    for name, record in nodes.items():
        for profile in record.profiles or []:
            if profile not in inventory.profiles:
                raise InvalidInventory(f"node {name}: profiles: unknown profile {profile!r}")


def _check_node(node: Node, claims: Claims) -> None:
    """One merged node's own rules, then its claims on MACs, addresses and its BMC."""
    name = node.name
    for dev, netdev in (node.record.netdevs or {}).items():
        _check_network(name, dev, netdev)
        if not claims.loopback_ok:
            _check_not_loopback(name, dev, netdev)
        claims.claim("mac", netdev.mac, name, f"netdevs.{dev}.mac")
        claims.claim("ip", netdev.ipaddr, name, f"netdevs.{dev}.ipaddr")
        claims.claim("ip", netdev.ipaddr6, name, f"netdevs.{dev}.ipaddr6")
    _claim_bmc(claims, node)


def _check_names(records: dict, kind: str) -> None:
    """Record names are checked when a file is parsed; a draft edited in place (a name from
    a request) is checked here, or the file written would no longer load."""
    for name in records:
        try:
            check_name(name, f"{kind} name")
        except ValueError as exc:
            raise InvalidInventory(str(exc)) from None


def _claim_bmc(claims: Claims, node: Node) -> None:
    """One BMC endpoint per node: address, port and system id together (several Redfish
    systems can share an address, as sushy-tools serves them). A fake BMC is the node's own
    whatever its address (the address only picks a behaviour)."""
    bmc = node.record.bmc
    if not (bmc and bmc.address) or bmc.driver is BmcDriver.FAKE:
        return
    port = bmc_port(bmc.driver and bmc.driver.value, bmc.scheme, bmc.port)
    shown = bmc.address + (f" port {bmc.port}" if bmc.port else "") + (
        f" system {bmc.system_id}" if bmc.system_id else "")
    claims.claim("bmc", (bmc.address, port, bmc.system_id), node.name, "bmc.address", shown)


def _check_not_loopback(node: str, dev: str, netdev) -> None:
    for field in ("ipaddr", "gateway", "ipaddr6"):
        value = getattr(netdev, field)
        if value and (value.startswith("127.") or value == "::1"):
            raise InvalidInventory(
                f"node {node}: netdevs.{dev}.{field}: {value} is loopback, not a node's "
                "address (only a server whose server.address is loopback has such nodes)")


def _check_network(node: str, dev: str, netdev) -> None:
    if not (netdev.ipaddr and netdev.netmask):
        return
    network = ipaddress.IPv4Network(f"{netdev.ipaddr}/{netdev.netmask}", strict=False)
    address = ipaddress.IPv4Address(netdev.ipaddr)
    if address in (network.network_address, network.broadcast_address) and network.prefixlen < 31:
        raise InvalidInventory(
            f"node {node}: netdevs.{dev}.ipaddr: {address} is the network or broadcast "
            f"address of {network}")
    if netdev.gateway and ipaddress.IPv4Address(netdev.gateway) not in network:
        raise InvalidInventory(
            f"node {node}: netdevs.{dev}.ipaddr: {address} is outside the network of its "
            f"gateway {netdev.gateway} (netmask {netdev.netmask})")
