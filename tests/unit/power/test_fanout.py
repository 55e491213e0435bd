"""fan_out: concurrency limit, hard deadline per call, abandoned calls keep no slot."""

from __future__ import annotations

import io
import threading

from provisiond.errors import BmcError
from provisiond.power import fanout
from provisiond.power.fanout import fan_out


def test_results_keep_the_order_of_names_and_carry_values():
    results = fan_out(["b", "a", "c"], lambda n: n.upper(), lambda n: 5, 2)
    assert [(r.node, r.ok, r.detail) for r in results] == [
        ("b", True, "B"), ("a", True, "A"), ("c", True, "C")]


def test_errors_are_per_node_and_a_driver_bug_is_contained():
    def call(name):
        if name == "bad":
            raise BmcError("refused")
        if name == "bug":
            raise KeyError("x")
        return {"v": 1}

    results = {r.node: r for r in fan_out(["ok", "bad", "bug"], call, lambda n: 5, 4)}
    assert results["ok"].ok and results["ok"].value == {"v": 1}
    assert not results["bad"].ok and results["bad"].detail == "refused"
    assert "internal error: KeyError" in results["bug"].detail


def test_concurrency_limit_is_respected(monkeypatch):
    """At most three in flight whenever the fan-out waits (read from its own table of
    running calls), and three really run at once: they meet at a barrier of three, which
    fewer slots would never trip."""
    in_flight = []
    wait_one = fanout._Runner.wait_one

    def counting_wait_one(runner):
        in_flight.append(len(runner.running))
        wait_one(runner)

    monkeypatch.setattr(fanout._Runner, "wait_one", counting_wait_one)
    three = threading.Barrier(3)

    def call(name):
        three.wait(timeout=30)
        return "ok"

    results = fan_out([f"n{i}" for i in range(21)], call, lambda n: 60, 3)
    assert [r.detail for r in results] == ["ok"] * 21
    assert max(in_flight) == 3


def test_hung_calls_are_abandoned_at_their_deadline_and_free_their_slot():
    """Two hung BMCs fill both slots; the ten live calls still run, and finish while both
    hung calls are still blocked: an abandoned call keeps no slot and stalls nobody."""
    release = threading.Event()
    lock, blocked, seen_blocked = threading.Lock(), [0], []

    def call(name):
        if name.startswith("dead"):
            with lock:
                blocked[0] += 1
            release.wait(60)
            with lock:
                blocked[0] -= 1
            return "late"
        with lock:
            seen_blocked.append(blocked[0])
        return "ok"

    names = ["dead1", "dead2"] + [f"n{i}" for i in range(10)]
    try:
        results = fan_out(names, call, lambda n: 0.5, 2)
        still_blocked = blocked[0]
    finally:
        release.set()
    assert still_blocked == 2 and seen_blocked == [2] * 10
    dead = [r for r in results if not r.ok]
    assert [r.node for r in dead] == ["dead1", "dead2"]
    assert all("no answer within 0.5 s" in r.detail for r in dead)
    assert [r.detail for r in results if r.ok] == ["ok"] * 10


def test_progress_sees_every_node_once():
    seen = []
    fan_out(["a", "b", "c"], lambda n: "ok", lambda n: 5, 2, progress=seen.append)
    assert sorted(r.node for r in seen) == ["a", "b", "c"]


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_draws_only_on_a_terminal():
    from provisiond.power.progress import ProgressBar

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar(2, "power on", stream)
        fan_out(["a", "b"], lambda n: "ok" if n == "a" else 1 / 0, lambda n: 5, 1, bar)
    assert tty.getvalue().endswith("] 2/2 ok 1 error 1\n") and "power on [" in tty.getvalue()
    assert pipe.getvalue() == ""
