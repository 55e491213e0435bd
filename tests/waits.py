"""Waiting on a condition with a bounded deadline (never a fixed sleep, never a wall-time
assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(check: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """check()'s first true value within `timeout` s; else TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(interval)


def blocked_on_a_lock(pid: int) -> bool:
    """The process waits for an flock (a `->` line of /proc/locks names it)."""
    with open("/proc/locks") as handle:
        return any(len(words) > 5 and words[1] == "->" and words[5] == str(pid)
                   for words in (line.split() for line in handle))
