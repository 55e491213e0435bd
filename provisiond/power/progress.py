"""A one-line progress bar on stderr for long fan-outs, shown only on a terminal."""

from __future__ import annotations

import sys

from provisiond.power.fanout import NodeResult

WIDTH = 30


class ProgressBar:
    """Call with each NodeResult; draws `[#####     ] 12/50 ok 11 error 1` in place."""

    def __init__(self, total: int, label: str, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = total > 1 and self.stream.isatty()
        self.total, self.label = total, label
        self.done = self.errors = 0

    def __call__(self, result: NodeResult) -> None:
        self.done += 1
        self.errors += not result.ok
        if self.enabled:
            filled = WIDTH * self.done // self.total
            self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (WIDTH - filled)}] "
                              f"{self.done}/{self.total} ok {self.done - self.errors} "
                              f"error {self.errors}")
            if self.done == self.total:
                self.stream.write("\n")
            self.stream.flush()
