"""Whole-inventory checks that one record's schema cannot make: references, uniqueness,
addresses inside their network."""

from __future__ import annotations

import ipaddress

from provisiond.errors import InvalidInventory
from provisiond.inventory.merge import Node, merge_all
from provisiond.inventory.model import Inventory


def validate_inventory(inventory: Inventory) -> dict[str, Node]:
    """Raise InvalidInventory naming the first problem; return the merged nodes if none."""
    for name, profile in inventory.profiles.items():
        if profile.profiles:
            raise InvalidInventory(f"profile {name}: profiles: a profile cannot list profiles")
    for name, record in inventory.nodes.items():
        for profile in record.profiles or []:
            if profile not in inventory.profiles:
                raise InvalidInventory(f"node {name}: profiles: unknown profile {profile!r}")
    nodes = merge_all(inventory)
    seen_macs: dict[str, str] = {}
    seen_ips: dict[str, str] = {}
    for name, node in nodes.items():
        for dev, netdev in (node.record.netdevs or {}).items():
            _check_network(name, dev, netdev)
            _claim(seen_macs, netdev.mac, name, f"netdevs.{dev}.mac")
            _claim(seen_ips, netdev.ipaddr, name, f"netdevs.{dev}.ipaddr")
            _claim(seen_ips, netdev.ipaddr6, name, f"netdevs.{dev}.ipaddr6")
    return nodes


def _claim(seen: dict[str, str], value: str | None, node: str, field: str) -> None:
    if value is None:
        return
    owner = seen.setdefault(value, node)
    if owner != node:
        raise InvalidInventory(f"node {node}: {field}: {value} is already used by node {owner}")


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
