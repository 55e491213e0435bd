"""Side effects of the UDP servers kept off their hot loop: phase records and discovery.

The DHCP loop must answer thousands of packets a second, so it only queues a phase (one
writer thread does the locked, fsynced write) and appends discovery lines rate-limited.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time

from provisiond.config import Config
from provisiond.states import NodePhase

log = logging.getLogger("provisiond.boot")
DISCOVERY_FILE = "discovery.jsonl"


class PhaseRecorder:
    """Records phases from a single writer thread; repeats within `quiet` seconds are dropped."""

    def __init__(self, config: Config, quiet: float = 5.0):
        self.config = config
        self.quiet = quiet
        self._last: dict[tuple[str, str], float] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._thread = threading.Thread(target=self._run, name="phase-writer", daemon=True)
        self._thread.start()

    def record(self, node: str, phase: NodePhase, detail: str = "") -> None:
        now = time.monotonic()
        key = (node, phase.value)
        if now - self._last.get(key, -1e9) < self.quiet:
            return
        self._last[key] = now
        try:
            self._queue.put_nowait((node, phase, detail))
        except queue.Full:
            log.warning("phase queue full, dropped %s %s", node, phase.value)

    def flush(self) -> None:
        """Wait until every queued phase is written."""
        self._queue.join()

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        from provisiond.status import record_phase

        while (item := self._queue.get()) is not None:
            try:
                record_phase(self.config, *item)
            except OSError as exc:
                log.error("cannot record phase %s for %s: %s", item[1].value, item[0], exc)
            finally:
                self._queue.task_done()


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
    """The discovery events recorded so far, oldest first."""
    path = config.state_dir / DISCOVERY_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]
