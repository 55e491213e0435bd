"""Discovery: unknown MACs asking for DHCP, as JSON lines in the state dir, rate-limited."""

from __future__ import annotations

import json
import logging
import time

from provisiond.config import Config

log = logging.getLogger("provisiond.boot")
DISCOVERY_FILE = "discovery.jsonl"


class DiscoveryLog:
    """Appends unknown MACs to `<state>/discovery.jsonl`: once per MAC per `per_mac`
    seconds and at most `per_second` lines a second overall."""

    def __init__(self, config: Config, per_mac: float = 300.0, per_second: int = 20):
        self.path = config.state_dir / DISCOVERY_FILE
        self.per_mac = per_mac
        self.per_second = per_second
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
        line = json.dumps({"time": round(now, 3), "mac": mac, **fields}, sort_keys=True)
        try:
            with open(self.path, "a") as handle:
                handle.write(line + "\n")
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
    """The discovery events recorded so far, oldest first; a line that is not a JSON object
    (cut short by a full disk, edited by hand) is skipped."""
    path = config.state_dir / DISCOVERY_FILE
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found
