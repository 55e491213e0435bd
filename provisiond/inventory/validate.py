"""Whole-inventory checks that one record's schema cannot make: references, uniqueness,
addresses inside their network and not the server's own."""

from __future__ import annotations

import ipaddress

from provisiond.config import Config
from provisiond.errors import InvalidInventory
from provisiond.inventory.merge import Node, merge_all
from provisiond.inventory.model import Inventory, check_name
from provisiond.states import BmcDriver


def validate_inventory(inventory: Inventory, config: Config | None = None) -> dict[str, Node]:
    """Raise InvalidInventory naming the first problem; return the merged nodes if none.
    With `config`, a node may not have the server's own address, nor a loopback one unless
    the server's is loopback too (a server on loopback, as in tests and demos, is reached by
    loopback clients only; anywhere else a loopback node address is a mistake, and would
    hand the node's runtime overlay to any local process)."""
    _check_names(inventory)
    for name, profile in inventory.profiles.items():
        if profile.profiles:
            raise InvalidInventory(f"profile {name}: profiles: a profile cannot list profiles")
    for name, record in inventory.nodes.items():
        for profile in record.profiles or []:
            if profile not in inventory.profiles:
                raise InvalidInventory(f"node {name}: profiles: unknown profile {profile!r}")
    nodes = merge_all(inventory)
    seen_macs: dict = {}
    seen_ips: dict = {}
    seen_bmcs: dict = {}
    loopback_ok = True
    if config is not None:
        server = ipaddress.ip_address(config.server.address)
        seen_ips[str(server)] = "the server (server.address)"
        loopback_ok = server.is_loopback
    for name, node in nodes.items():
        for dev, netdev in (node.record.netdevs or {}).items():
            _check_network(name, dev, netdev)
            if not loopback_ok:
                _check_not_loopback(name, dev, netdev)
            _claim(seen_macs, netdev.mac, name, f"netdevs.{dev}.mac")
            _claim(seen_ips, netdev.ipaddr, name, f"netdevs.{dev}.ipaddr")
            _claim(seen_ips, netdev.ipaddr6, name, f"netdevs.{dev}.ipaddr6")
        _claim_bmc(seen_bmcs, node)
    return nodes


def _check_names(inventory: Inventory) -> None:
    """Record names are checked when a file is parsed; a draft edited in place (a name from
    a request) is checked here, or the file written would no longer load."""
    for kind, records in (("profile", inventory.profiles), ("node", inventory.nodes)):
        for name in records:
            try:
                check_name(name, f"{kind} name")
            except ValueError as exc:
                raise InvalidInventory(str(exc)) from None


def _claim(seen: dict, value, node: str, field: str, shown: str | None = None) -> None:
    if value is None:
        return
    owner = seen.setdefault(value, f"node {node}")
    if owner != f"node {node}":
        raise InvalidInventory(
            f"node {node}: {field}: {shown or value} is already used by {owner}")


def _claim_bmc(seen: dict, node: Node) -> None:
    """One BMC endpoint per node: address, port and system id together (several Redfish
    systems can share an address, as sushy-tools serves them). A fake BMC is the node's own
    whatever its address (the address only picks a behaviour)."""
    bmc = node.record.bmc
    if not (bmc and bmc.address) or bmc.driver is BmcDriver.FAKE:
        return
    shown = bmc.address + (f" port {bmc.port}" if bmc.port else "") + (
        f" system {bmc.system_id}" if bmc.system_id else "")
    _claim(seen, (bmc.address, bmc.port, bmc.system_id), node.name, "bmc.address", shown)


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
