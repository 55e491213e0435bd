"""tftp.LogLimit: lines a second, and the count of those held back told with the next."""

from __future__ import annotations

import logging

from provisiond.boot.tftp import LogLimit


def test_lines_over_the_limit_are_held_back_and_counted(caplog):
    now = [100.0]
    limit = LogLimit(per_second=2, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="provisiond.boot"):
        for n in range(5):
            limit.log(logging.INFO, "line %d", n)
        now[0] = 101.5
        limit.log(logging.INFO, "line %d", 5)
        limit.log(logging.INFO, "line %d", 6)
        limit.log(logging.INFO, "line %d", 7)
        now[0] = 102.0
        limit.log(logging.INFO, "line %d", 8)
    assert caplog.messages == ["line 0", "line 1", "line 5 (3 more not logged before it)",
                               "line 6", "line 8 (1 more not logged before it)"]
