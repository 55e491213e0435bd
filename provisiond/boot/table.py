"""The boot table: what the boot servers need from the inventory, keyed for fast lookups.

Built once from the merged, validated inventory and rebuilt when `inventory.yaml` changes on
the store (serve follows the store's watch; an HTTP worker compares the key's revision: on
etcd with each request, in the copy its watch keeps, provisiond.state.watched; on files at
most once a second), so DHCP, DNS and every HTTP worker answer from plain dicts, and a change
made through any server or the CLI reaches each within a second.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from provisiond.config import Config
from provisiond.errors import ProvisiondError
from provisiond.state import open as opening
from provisiond.state.store import ABSENT, Compacted
from provisiond.state.layout import KEYS, Layout

INVENTORY_KEY = str(KEYS.inventory)

log = logging.getLogger("provisiond.boot")
T = TypeVar("T")


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
    by_ip6: dict[str, BootEntry] = field(default_factory=dict)
    version: object = None  # the provisiond.inventory.store.Version it was built from

    @classmethod
    def empty(cls) -> "BootTable":
        return cls({}, {}, {})

    def node_for_ip(self, address: str):
        """The node an IPv4 or IPv6 address is reserved for, or None."""
        entry = self.by_ip.get(address) or self.by_ip6.get(address)
        return self.nodes.get(entry.node) if entry else None


BAD_DATA_ERRORS = (ProvisiondError, OSError, ValueError)
"""What a bad record, file or packet raises; anything else caught broadly is a bug."""


def traceback_if_bug(exc: BaseException) -> BaseException | None:
    """exc_info for a log line: the traceback of an error bad data does not explain, so a bug
    caught by a guard that keeps a service up is still seen in the server log."""
    return None if isinstance(exc, BAD_DATA_ERRORS) else exc


class SkippedRecords:
    """Records a builder could not use: skipped, and logged as one line per build.

    Defence in depth: the inventory's schema and validate_inventory should let no bad record
    through, but one that slips past must cost its own answers, never a service."""

    def __init__(self, what: str):
        self.what = what
        self.problems: list[str] = []
        self.bug: BaseException | None = None

    def build(self, name: str, make: Callable[[], T]) -> T | None:
        """make(), or None (the record skipped) if it raises."""
        try:
            return make()
        except Exception as exc:  # any error from one record: skip it, keep the rest
            self.problems.append(f"{name}: {exc or type(exc).__name__}")
            self.bug = self.bug or traceback_if_bug(exc)
            return None

    def report(self) -> None:
        """One error line; with the first bug's traceback if an error was not bad data."""
        if self.problems:
            shown = "; ".join(self.problems[:3])
            more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
            log.error("%s: skipped %d bad record(s): %s%s", self.what, len(self.problems),
                      shown, more, exc_info=self.bug)


def build_table(config: Config, previous: BootTable | None = None) -> BootTable:
    """Read the inventory, check it with the CLI's rules (validate_inventory with the config:
    known profiles, unique MACs and addresses, not the server's own...) and index every netdev
    that has a MAC or an address. With the `previous` table, only the nodes that changed
    since are merged and checked again (InventoryStore.valid_nodes): 10,000 nodes took
    1-3 s of a loaded core per change.

    Raises InvalidInventory for an inventory the CLI would refuse to write."""
    from provisiond.inventory import InventoryStore

    before = (previous.version, previous.nodes) if previous and previous.version else None
    version, nodes = InventoryStore(config).valid_nodes(before)
    return dataclasses.replace(index_nodes(nodes), version=version)


def index_nodes(nodes: dict) -> BootTable:
    """The table of merged nodes: their netdevs by MAC, by IPv4 and by IPv6 address."""
    by_mac: dict[str, BootEntry] = {}
    by_ip: dict[str, BootEntry] = {}
    by_ip6: dict[str, BootEntry] = {}
    skipped = SkippedRecords("boot table")
    for node in nodes.values():
        for entry in skipped.build(f"node {node.name}", lambda: _entries(node)) or []:
            if entry.mac:
                by_mac[entry.mac] = entry
            if entry.ipaddr:
                by_ip.setdefault(entry.ipaddr, entry)
            if entry.ipaddr6:
                by_ip6.setdefault(entry.ipaddr6, entry)
    skipped.report()
    return BootTable(by_mac, by_ip, nodes, by_ip6)


def _entries(node) -> list[BootEntry]:
    record = node.record
    return [BootEntry(node.name, dev.mac or "", dev.ipaddr or "", dev.netmask, dev.gateway,
                      dev.ipaddr6, record.image)
            for _, dev in sorted((record.netdevs or {}).items())]


def reverse_name(address: str) -> str:
    return ipaddress.ip_address(address).reverse_pointer


class TableWatcher:
    """Holds the current table and rebuilds it when inventory.yaml's revision changes.

    An inventory that does not load or validate is logged as one line and the last good
    table kept; at start there is none, so no node is served until the file is fixed (the
    fix is picked up like any change, no restart). A file that goes missing or empty while
    serving (rm, a truncating editor) is refused the same way; at start it means no nodes.

    `reads`: what `changed` reads the revision through (an HTTP worker's WatchedCopy), the
    store by default.

    One rebuild at a time: the requests that meet a change while one rebuilds take the table
    as it is (on etcd a worker compares with every request: a storm's requests each rebuilt
    it, and an older rebuild that ended last put its table back over a later one's)."""

    def __init__(self, config: Config, interval: float = 1.0, reads=None):
        self.config = config
        self.interval = interval
        self.store = opening.open_store(config)
        self.reads = reads or self.store
        self._checked = 0.0
        self._reloading = threading.Lock()
        self._seen = ABSENT
        self._seen = self._revision()  # taken before the load: a later change reloads
        self._watched = self._seen  # where wait_changed watches from
        self.table = BootTable.empty()
        self.valid = False
        self._load(keeping="serving no nodes until it is fixed")

    def current(self) -> BootTable:
        """The table, reloaded first if the inventory changed (looked at once per interval)."""
        self.changed()
        return self.table

    def changed(self) -> bool:
        """Rebuild if the inventory's revision changed since the last look (at most once per
        interval); True if the table was rebuilt."""
        now = time.monotonic()
        if now - self._checked < self.interval:
            return False
        self._checked = now
        return self._compare()

    def wait_changed(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the inventory to change on the store (its watch:
        no polling of ours) and rebuild; True if the table was rebuilt."""
        try:
            changes = self.store.watch(INVENTORY_KEY, self._watched, timeout)
        except Compacted:  # changes missed: compare with what is there now, watch from now
            # (from the inventory's revision, compacted, each watch failed at once: serve's
            # loop watched again at once, for good, the inventory read each time)
            try:
                self._watched = self.store.revision()  # before the compare: nothing missed
            except (ProvisiondError, OSError) as exc:
                log.error("inventory: cannot watch %s: %s; keeping the table", self.store.url,
                          exc)
                time.sleep(timeout)
                return False
            return self._compare()
        except (ProvisiondError, OSError) as exc:  # the store is away: keep the table
            log.error("inventory: cannot watch %s: %s; keeping the table", self.store.url, exc)
            time.sleep(timeout)
            return False
        ours = [change for change in changes if change.key == INVENTORY_KEY]
        if changes and not ours:  # only keys that share its start (a schema backup)
            self._watched = max(self._watched, changes[-1].revision)
        if not ours:
            return False
        with self._reloading:
            return self._reload(ours[-1].revision)

    def _compare(self) -> bool:
        if not self._reloading.acquire(blocking=False):
            return False  # another request rebuilds it meanwhile: the table as it is
        try:
            revision = self._revision()
            return revision != self._seen and self._reload(revision)
        finally:
            self._reloading.release()

    def _reload(self, revision: int) -> bool:
        keeping = (f"keeping the last good table ({len(self.table.nodes)} nodes)"
                   if self.valid else "still serving no nodes")
        try:
            entry = self.store.get(INVENTORY_KEY)
        except (ProvisiondError, OSError) as exc:  # away: the change is read when it is back
            log.error("inventory: cannot read %s: %s; %s", self.store.url, exc, keeping)
            return False
        self._seen = revision
        self._watched = max(self._watched, revision)
        if entry is None or not entry.value:  # the CLI never leaves it missing or empty
            log.error("inventory %s is missing or empty, %s", Layout.of(self.config).inventory,
                      keeping)
            return False
        return self._load(keeping)

    def _load(self, keeping: str) -> bool:
        try:
            table = build_table(self.config, self.table if self.valid else None)
        except Exception as exc:  # a bad file (or a bug) must not end the service
            reason = exc if isinstance(exc, ProvisiondError) else f"{type(exc).__name__}: {exc}"
            log.error("inventory %s not loaded, %s: %s", Layout.of(self.config).inventory, keeping,
                      reason, exc_info=traceback_if_bug(exc))
            return False
        if not self.valid and self._checked:
            log.info("inventory %s loaded again: %d nodes", Layout.of(self.config).inventory,
                     len(table.nodes))
        self.table, self.valid = table, True
        return True

    def _revision(self) -> int:
        """The inventory's revision on the store (ABSENT: there is none)."""
        try:
            entry = self.reads.get(INVENTORY_KEY)
        except (ProvisiondError, OSError) as exc:  # unreadable: the load says why
            log.debug("inventory: %s", exc)
            return self._seen
        return entry.revision if entry else ABSENT
