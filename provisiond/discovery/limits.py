"""A per-address call budget: at most `limit` calls in each `window` seconds, counted per
process (each HTTP worker has its own), remembering at most `addresses` addresses."""

from __future__ import annotations


class AddressWindow:
    def __init__(self, limit: int, window: float, addresses: int = 4096):
        self.limit = limit
        self.window = window
        self.addresses = addresses
        self.windows: dict[str, tuple[float, int]] = {}   # address -> (start, calls)

    def allow(self, address: str, now: float) -> bool:
        """Count a call from `address` at `now`; False once it is over its budget."""
        start, count = self.windows.pop(address, (now, 0))
        if now - start >= self.window:
            start, count = now, 0
        self.windows[address] = (start, count + 1)  # re-inserted: the newest last
        if len(self.windows) > self.addresses:
            self.windows.pop(next(iter(self.windows)))
        return count < self.limit
