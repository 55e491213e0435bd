"""Run one BMC call per node in parallel: a concurrency limit and a hard deadline per call.

Each call runs in its own daemon thread. A call still running at its deadline is reported
as BmcUnreachable and abandoned: its thread keeps no slot, so one dead BMC never stalls
the rest, and a late answer is ignored.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from provisiond.errors import BmcUnreachable, ProvisiondError

GRACE_SECONDS = 0.5


@dataclass
class NodeResult:
    """What happened on one node: ok or error, a one-line detail, and the call's value;
    `error` names the error's class (InternalError for a bug) for counting."""

    node: str
    ok: bool
    detail: str
    value: object = None
    seconds: float = 0.0
    error: str | None = None

    def to_data(self) -> dict:
        data = {"node": self.node, "result": "ok" if self.ok else "error",
                "detail": self.detail, "seconds": round(self.seconds, 3)}
        if self.value is not None and not isinstance(self.value, str):
            data["value"] = self.value
        return data


def fan_out(names: list[str], call: Callable[[str], object], timeout_for: Callable[[str], float],
            concurrency: int, progress: Callable[[NodeResult], None] | None = None
            ) -> list[NodeResult]:
    """`call(node)` for every node, at most `concurrency` at once; results in `names` order.

    `call` returns a value (a str is the detail) or raises; `timeout_for(node)` is the
    node's deadline in seconds from the start of its call."""
    runner = _Runner(call, progress)
    pending = list(names)
    while pending or runner.running:
        while pending and len(runner.running) < max(1, concurrency):
            node = pending.pop(0)
            runner.start(node, timeout_for(node))
        runner.wait_one()
    return [runner.results[name] for name in names]


class _Runner:
    """The threads in flight and the results so far."""

    def __init__(self, call, progress):
        self.call, self.progress = call, progress
        self.running: dict[str, tuple[float, float]] = {}  # node -> (start, deadline)
        self.results: dict[str, NodeResult] = {}
        self.done: queue.Queue = queue.Queue()

    def start(self, node: str, timeout: float) -> None:
        now = time.monotonic()
        self.running[node] = (now, now + timeout + GRACE_SECONDS)
        threading.Thread(target=self._run, args=(node,), daemon=True,
                         name=f"bmc-{node}").start()

    def _run(self, node: str) -> None:
        try:
            value = self.call(node)
            self.done.put((node, True, value if isinstance(value, str) else "ok", value, None))
        except ProvisiondError as exc:
            self.done.put((node, False, str(exc), None, type(exc).__name__))
        except Exception as exc:  # noqa: BLE001 - a driver bug must not stop the fan-out
            self.done.put((node, False, f"internal error: {type(exc).__name__}: {exc}", None,
                           "InternalError"))

    def wait_one(self) -> None:
        """Collect one finished call, or expire every call past its deadline."""
        nearest = min(deadline for _, deadline in self.running.values())
        try:
            node, ok, detail, value, error = self.done.get(
                timeout=max(0.0, nearest - time.monotonic()))
        except queue.Empty:
            self._expire()
            return
        if node in self.running:
            start, _ = self.running.pop(node)
            self._finish(NodeResult(node, ok, detail, value, time.monotonic() - start, error))

    def _expire(self) -> None:
        now = time.monotonic()
        for node, (start, deadline) in list(self.running.items()):
            if deadline <= now:
                del self.running[node]
                message = f"no answer within {deadline - start - GRACE_SECONDS:g} s"
                self._finish(NodeResult(node, False, str(BmcUnreachable(message)),
                                        seconds=now - start, error=BmcUnreachable.__name__))

    def _finish(self, result: NodeResult) -> None:
        self.results[result.node] = result
        if self.progress:
            self.progress(result)
