"""Refused provisioning tokens made visible, and bounded: a flood of refusals, for one node
or spread over every node, is a few journal events and status writes, not one per request."""

from __future__ import annotations

from provisiond.events import read_since
from provisiond.status import read_status
from provisiond.trust import ProvisioningTokenRefused, Refusal, RefusalLog
from provisiond.trust import refusals as refusals_module


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused(node: str) -> ProvisioningTokenRefused:
    return ProvisioningTokenRefused(node, Refusal.INVALID, "10.200.0.7")


def events(config) -> list[str]:
    return [e.subject for e in read_since(config, 0) if e.kind == "token.refused"]


def test_refusals_spread_over_many_nodes_are_bounded_in_all(config, monkeypatch):
    """Each node under its own share still adds up: 300 nodes refused once each within a
    window would be 300 events and 300 status writes (a journal of refusals, the rest of the
    events pushed out). The bound in all holds them to a few; a later window gets its own."""
    clock = Clock()
    monkeypatch.setattr(refusals_module.time, "monotonic", clock)
    log = RefusalLog(config)
    noted = [log.note(refused(f"n{i}")) for i in range(300)]
    assert 1 <= sum(noted) <= 20 and len(events(config)) == sum(noted)
    assert sum(read_status(config, f"n{i}") is not None for i in range(300)) == sum(noted)
    assert log.skipped == 300 - sum(noted)
    clock.now += log.window
    assert log.note(refused("n299"))  # a new window: recorded again


def test_one_node_gets_a_few_per_window(config, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(refusals_module.time, "monotonic", clock)
    log = RefusalLog(config)
    assert sum(log.note(refused("n1")) for _ in range(50)) == log.burst
    assert log.note(refused("n2"))  # another node is not held back by n1's flood
    clock.now += log.window
    assert log.note(refused("n1"))
