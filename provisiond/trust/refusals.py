"""Refused provisioning tokens, made visible: a `token.refused` event (reason, address) and
the node's last refusal in its status (`node status`, `GET /api/v1/status`)."""

from __future__ import annotations

import logging
import time

from provisiond.config import Config
from provisiond.events import emit
from provisiond.status import record_refusal
from provisiond.trust.credentials import ProvisioningTokenRefused

log = logging.getLogger("provisiond.trust")


class RefusalLog:
    """Notes refusals, at most `burst` per node every `window` s in this process: a client
    sending tokens in a loop costs the journal and the status file a few records, not one
    per request (the rest are counted in the server log)."""

    def __init__(self, config: Config, burst: int = 5, window: float = 10.0):
        self.config = config
        self.burst = burst
        self.window = window
        self._recent: dict[str, list[float]] = {}
        self.skipped = 0

    def note(self, refused: ProvisioningTokenRefused) -> bool:
        """Record `refused` unless its node is over its share; True if recorded."""
        if not self._admit(refused.node):
            self.skipped += 1
            if self.skipped & (self.skipped - 1) == 0:  # 1st, 2nd, 4th...
                log.warning("token refusals: %d not recorded (too many for one node)",
                            self.skipped)
            return False
        log.warning("%s: provisioning token refused (%s) from %s", refused.node,
                    refused.reason.value, refused.address)
        data = {"reason": refused.reason.value, "address": refused.address}
        record_refusal(self.config, refused.node, data)
        emit(self.config, "token.refused", refused.node, data)
        return True

    def _admit(self, node: str) -> bool:
        now = time.monotonic()
        if len(self._recent) > 10_000:
            self._recent.clear()
        times = [t for t in self._recent.get(node, []) if now - t < self.window]
        admitted = len(times) < self.burst
        if admitted:
            times.append(now)
        self._recent[node] = times
        return admitted
