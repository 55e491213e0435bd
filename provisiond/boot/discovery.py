"""Discovery on the DHCP side: unknown MACs asking for DHCP, as JSON lines in the state dir
(rate-limited), and the pool of short leases they get when `discovery.pool` is set."""

from __future__ import annotations

import ipaddress
import logging
import os
import time

from provisiond.config import Config
from provisiond.discovery.machines import MachineState, read_book
from provisiond.state.layout import Layout
from provisiond.state.models import Sighting

log = logging.getLogger("provisiond.boot")


def enlisting(config: Config) -> bool:
    """Whether unknown machines may enlist: `dhcp.discovery` on and a `discovery.pool` to
    lease them addresses. Otherwise they are only recorded, and the discovery image and
    its open API routes are not offered."""
    return config.dhcp.discovery and config.discovery.pool is not None


SIGHTINGS_BYTES = 8 << 20  # about 80,000 lines


class DiscoveryLog:
    """Appends unknown MACs to `<state>/discovery.jsonl` (Layout.sightings, one Sighting
    a line): once per MAC per `per_mac` seconds and at most `per_second` lines a second
    overall. Past `max_bytes` the file becomes discovery.jsonl.1 (the one before goes): a
    host sending from ever new MACs fills no disk, and a listing reads two files at most."""

    def __init__(self, config: Config, per_mac: float = 300.0, per_second: int = 20,
                 max_bytes: int = SIGHTINGS_BYTES):
        layout = Layout.of(config)
        self.path, self.older = layout.sightings, layout.older_sightings
        self.per_mac = per_mac
        self.per_second = per_second
        self.max_bytes = max_bytes
        self._seen: dict[str, float] = {}
        self._window = (0, 0)

    def note(self, mac: str, **fields) -> bool:
        """Record an unknown MAC unless rate-limited; True if a line was written."""
        now = time.time()
        if now - self._seen.get(mac, -1e9) < self.per_mac or not self._take(int(now)):
            return False
        if len(self._seen) > 100_000:
            self._seen.clear()
        self._seen[mac] = now
        line = Sighting(time=round(now, 3), mac=mac, **fields).text()
        try:
            with open(self.path, "a") as handle:
                handle.write(line + "\n")
                full = handle.tell() >= self.max_bytes
            if full:
                os.replace(self.path, self.older)
        except OSError as exc:
            log.error("cannot write %s: %s", self.path, exc)
            return False
        return True

    def _take(self, second: int) -> bool:
        start, count = self._window
        if start != second:
            start, count = second, 0
        self._window = (start, count + 1)
        return count < self.per_second


def read_discovery(config: Config) -> list[dict]:
    """The discovery events recorded so far (those the log still keeps), oldest first; a
    line that is no Sighting (cut short by a full disk, edited by hand) is skipped."""
    layout = Layout.of(config)
    lines = []
    for path in (layout.older_sightings, layout.sightings):
        try:
            lines += path.read_bytes().splitlines()
        except FileNotFoundError:
            continue
    found = []
    for line in lines:
        try:
            found.append(Sighting.model_validate_json(line).document())
        except ValueError:  # a ValidationError is one
            continue
    return found


class DiscoveryPool:
    """Short leases for unknown MACs from `discovery.pool`: a MAC keeps its address while
    its lease runs (and gets it again after), a new one takes the first address no lease
    and no node holds. A full pool gives nothing (the MAC asks again later)."""

    def __init__(self, config: Config):
        settings = config.discovery
        first, last = settings.pool_range
        self.addresses = [str(ipaddress.IPv4Address(a)) for a in range(int(first), int(last) + 1)]
        self._members = frozenset(self.addresses)
        self.seconds = settings.lease_seconds
        self.leases: dict[str, tuple[str, float]] = {}   # mac -> (address, expiry)
        self.holders: dict[str, str] = {}                 # address -> mac
        self.full: tuple[object, float] | None = None
        """(reserved, until): found full with these node addresses, and no lease can run out
        before `until` (a flood of new MACs then costs no scan of the pool each)."""

    def offer(self, mac: str, reserved: dict, now: float | None = None) -> str | None:
        """The address for `mac` (kept or newly taken), or None if the pool is full;
        `reserved` holds the addresses nodes have (the boot table's by_ip)."""
        now = time.time() if now is None else now
        lease = self.leases.get(mac)
        if lease and lease[0] not in reserved:
            self.leases[mac] = (lease[0], now + self.seconds)
            return lease[0]
        if self.full and self.full[0] is reserved and now < self.full[1]:
            return None
        for address in self.addresses:
            holder = self.holders.get(address)
            if address in reserved or (holder and self.leases[holder][1] > now):
                continue
            self._take(mac, address, now)
            return address
        self.full = (reserved, min((e for _, e in self.leases.values() if e > now),
                                   default=now + self.seconds))
        return None

    def __contains__(self, address: str) -> bool:
        return address in self._members

    def restore(self, mac: str, address: str, expires: float, now: float) -> bool:
        """Hold a lease made before a restart (read back from the lease file): kept if it
        is unexpired, of an address of this pool, and neither its address nor its MAC has
        another restored lease."""
        if (expires <= now or address in self.holders or mac in self.leases
                or address not in self._members):
            return False
        self.holders[address] = mac
        self.leases[mac] = (address, expires)
        return True

    def current(self, now: float) -> dict[str, tuple[str, float]]:
        """The unexpired leases (offers not taken up yet included), by MAC."""
        return {mac: lease for mac, lease in self.leases.items() if lease[1] > now}

    def holds(self, mac: str, address: str, now: float | None = None) -> bool:
        """Whether `mac` has an unexpired lease of `address`."""
        lease = self.leases.get(mac)
        return bool(lease and lease[0] == address and
                    lease[1] > (time.time() if now is None else now))

    def release(self, mac: str) -> None:
        lease = self.leases.pop(mac, None)
        if lease is None:
            return  # nothing freed: a full pool stays full (every node's ACK releases)
        self.full = None
        if self.holders.get(lease[0]) == mac:
            del self.holders[lease[0]]

    def _take(self, mac: str, address: str, now: float) -> None:
        self.release(mac)
        old = self.holders.get(address)
        if old:
            self.leases.pop(old, None)
        self.holders[address] = mac
        self.leases[mac] = (address, now + self.seconds)


def hold_waiting(config: Config, pool: DiscoveryPool, now: float) -> int:
    """After the saved leases are read back (none: a first start, a lost or damaged lease
    file, or a release that saved no pool lease): hold, for one lease time from `now`, the
    pool address each machine waiting in the discovery book reported from, unless a saved
    lease holds that address or that machine; it may hold it still. How many were held. A machine between its lease
    and its first report is not in the book: a new machine may be offered its address."""
    try:
        machines = read_book(config).machines.values()
    except OSError as exc:
        log.error("dhcp: discovery book not read (%s): no pool address held for it", exc)
        return 0
    return sum(pool.restore(m.mac, m.address, now + pool.seconds, now) for m in machines
               if m.state is MachineState.PENDING)
