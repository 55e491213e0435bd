"""The boot table: what the boot servers need from the inventory, keyed for fast lookups.

Built once from the merged inventory and rebuilt when inventory.yaml changes (a stat at
most once a second), so DHCP, DNS and every HTTP worker answer from plain dicts.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from dataclasses import dataclass

from provisiond.config import Config
from provisiond.errors import ProvisiondError

log = logging.getLogger("provisiond.boot")


@dataclass(frozen=True)
class BootEntry:
    """One reserved address: a node's netdev with a MAC and an IPv4 address."""

    node: str
    mac: str
    ipaddr: str
    netmask: str | None
    gateway: str | None
    ipaddr6: str | None
    image: str | None


@dataclass(frozen=True)
class BootTable:
    by_mac: dict[str, BootEntry]
    by_ip: dict[str, BootEntry]
    nodes: dict          # name -> provisiond.inventory.Node

    def node_for_ip(self, address: str):
        entry = self.by_ip.get(address)
        return self.nodes.get(entry.node) if entry else None


def build_table(config: Config) -> BootTable:
    """Read and merge the inventory, then index every netdev that has a MAC or an address."""
    from provisiond.inventory import load_nodes

    nodes = load_nodes(config)
    by_mac: dict[str, BootEntry] = {}
    by_ip: dict[str, BootEntry] = {}
    for node in nodes.values():
        for entry in _entries(node):
            if entry.mac:
                by_mac[entry.mac] = entry
            if entry.ipaddr:
                by_ip.setdefault(entry.ipaddr, entry)
    return BootTable(by_mac, by_ip, nodes)


def _entries(node) -> list[BootEntry]:
    record = node.record
    return [BootEntry(node.name, dev.mac or "", dev.ipaddr or "", dev.netmask, dev.gateway,
                      dev.ipaddr6, record.image)
            for _, dev in sorted((record.netdevs or {}).items())]


def reverse_name(address: str) -> str:
    return ipaddress.ip_address(address).reverse_pointer


class TableWatcher:
    """Holds the current table and rebuilds it when inventory.yaml's mtime changes."""

    def __init__(self, config: Config, interval: float = 1.0):
        self.config = config
        self.interval = interval
        self._checked = 0.0
        self._stamp = self._stat()
        self.table = build_table(config)

    def current(self) -> BootTable:
        """The table, reloaded first if the inventory changed (stat at most per interval)."""
        self.changed()
        return self.table

    def changed(self) -> bool:
        """Rebuild if the inventory file changed since the last look; True if it did."""
        now = time.monotonic()
        if now - self._checked < self.interval:
            return False
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            self.table = build_table(self.config)
        except ProvisiondError as exc:
            log.error("inventory not reloaded, keeping the previous table: %s", exc)
            return False
        return True

    def _stat(self) -> tuple:
        try:
            st = os.stat(self.config.inventory_path)
        except FileNotFoundError:
            return ()
        return (st.st_mtime_ns, st.st_size, st.st_ino)
