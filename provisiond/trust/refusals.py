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
    """Notes refusals, at most `burst` per node and `total` in all every `window` s in this
    process: a client sending tokens in a loop, for one node or for each node in turn, costs
    the journal and the status files a few records, not one per request (the rest are
    counted in the server log)."""

    def __init__(self, config: Config, burst: int = 5, window: float = 10.0,
                 total: int = 20):
        self.config = config
        self.burst = burst
        self.window = window
        self.total = total
        self._recent: dict[str, list[float]] = {}  # node -> when recorded, in the window
        self.skipped = 0

    def note(self, refused: ProvisioningTokenRefused) -> bool:
        """Record `refused` unless its node, or all nodes, are over their share; True if
        recorded."""
        if not self._admit(refused.node):
            self.skipped += 1
            if self.skipped & (self.skipped - 1) == 0:  # 1st, 2nd, 4th...
                log.warning("token refusals: %d not recorded (too many)", self.skipped)
            return False
        log.warning("%s: provisioning token refused (%s) from %s", refused.node,
                    refused.reason.value, refused.address)
        data = {"reason": refused.reason.value, "address": refused.address}
        record_refusal(self.config, refused.node, data)
        emit(self.config, "token.refused", refused.node, data)
        return True

    def _admit(self, node: str) -> bool:
        """Whether a refusal for `node` may be recorded now (then it counts). Only nodes
        recorded within the window are kept: at most `total` of them."""
        now = time.monotonic()
        self._recent = {name: kept for name, times in self._recent.items()
                        if (kept := [t for t in times if now - t < self.window])}
        times = self._recent.get(node, [])
        if len(times) >= self.burst or sum(map(len, self._recent.values())) >= self.total:
            return False
        self._recent[node] = [*times, now]
        return True
