"""The SSE stream over the event journal, without a server: resuming, gaps, kinds, keepalive,
the per-worker bound (the served stream: tests/integration/api/test_api_jobs.py)."""

from __future__ import annotations

import json

import pytest

from provisiond import events
from provisiond.api.v1 import events as stream_module
from provisiond.api.v1.events import EventStream, StreamSlots, parse_kinds, start_after
from provisiond.errors import InvalidInput, Unavailable


class FakeTime:
    """A clock that a wait for events moves on; `on_sleep` runs at each wait (e.g. to
    emit), and the wait says there are new events when it returns something true."""

    def __init__(self):
        self.now, self.sleeps, self.on_sleep = 0.0, 0, None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        assert self.sleeps < 10_000, "the stream sent nothing for 25 minutes"
        return bool(self.on_sleep and self.on_sleep())

    def wait(self, config, after: int, timeout: float) -> bool:
        return self.sleep(timeout)


def messages(chunks) -> list[dict]:
    """The SSE messages in text chunks: {"id": str | None, "data": dict} or {"comment"}."""
    found = []
    for block in "".join(chunks).split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        if "" in fields:
            found.append({"comment": fields[""]})
        elif "data" in fields:
            found.append({"id": fields.get("id"), "data": json.loads(fields["data"])})
    return found


def take(stream, count: int) -> list[str]:
    chunks = iter(stream)
    assert next(chunks).startswith("retry: ")
    return [next(chunks) for _ in range(count)]


def emit_many(config, count: int, kind: str = "test.tick") -> list[int]:
    return [events.emit(config, kind, f"s{i}", {"i": i}) for i in range(count)]


def test_resumes_after_the_id_given_in_order(config):
    ids = emit_many(config, 5)
    sent = messages(take(EventStream(config, ids[1], None), 1))
    assert [m["id"] for m in sent] == [str(i) for i in ids[2:]]
    assert [m["data"]["data"]["i"] for m in sent] == [2, 3, 4]
    assert sent[0]["data"]["kind"] == "test.tick" and sent[0]["data"]["subject"] == "s2"


def test_new_events_arrive_and_nothing_is_sent_twice(config):
    ids = emit_many(config, 2)
    fake = FakeTime()
    stream = EventStream(config, ids[-1], None, clock=fake.clock, wait=fake.wait)
    fake.on_sleep = lambda: fake.sleeps == 3 and emit_many(config, 2, "test.late")
    sent = messages(take(stream, 1))
    assert [m["data"]["kind"] for m in sent] == ["test.late", "test.late"]
    assert [int(m["id"]) for m in sent] == [ids[-1] + 1, ids[-1] + 2]


def test_a_trimmed_journal_is_a_gap_message_first(config, monkeypatch):
    monkeypatch.setattr(events, "MAX_BYTES", 2000)
    monkeypatch.setattr(events, "KEEP_BYTES", 1000)
    emit_many(config, 60)
    oldest = events.oldest_id(config)
    assert oldest > 10
    sent = messages(take(EventStream(config, 3, None), 1))
    gap = sent[0]
    assert gap["id"] is None and gap["data"]["kind"] == "stream.gap"
    assert gap["data"]["data"] == {"after": 3, "oldest_id": oldest, "missed": oldest - 4}
    assert [int(m["id"]) for m in sent[1:]] == list(range(oldest, 61))


def test_no_gap_when_nothing_was_lost(config, monkeypatch):
    emit_many(config, 3)
    sent = messages(take(EventStream(config, 0, None), 1))
    assert [m["data"]["kind"] for m in sent] == ["test.tick"] * 3


def test_an_id_beyond_a_new_journal_is_a_gap_then_everything_it_holds(config):
    emit_many(config, 2)
    sent = messages(take(EventStream(config, 500, None), 1))
    assert sent[0]["data"]["data"] == {"after": 500, "oldest_id": 1, "missed": None}
    assert [m["id"] for m in sent[1:]] == ["1", "2"]


def test_kinds_keep_exact_kinds_and_prefixes(config):
    events.emit(config, "job.started", "job/1")
    events.emit(config, "node.phase", "n1")
    events.emit(config, "job.finished", "job/1")
    events.emit(config, "inventory.changed")
    stream = EventStream(config, 0, parse_kinds("job., inventory.changed"))
    sent = messages(take(stream, 1))
    assert [m["data"]["kind"] for m in sent] == ["job.started", "job.finished",
                                                 "inventory.changed"]
    assert stream.last == 4


def test_filtered_events_are_not_read_again(config, monkeypatch):
    """Past the events the filter drops, the next read starts after the newest id."""
    emit_many(config, 50, "node.phase")
    fake = FakeTime()
    stream = EventStream(config, 0, frozenset({"job."}), clock=fake.clock, wait=fake.wait)
    reads = []
    real = events.read_since
    monkeypatch.setattr(events, "read_since", lambda c, after, *a: reads.append(after) or
                        real(c, after, *a))
    fake.on_sleep = lambda: fake.sleeps == 2 and events.emit(config, "job.started", "job/1")
    sent = messages(take(stream, 1))
    assert [m["id"] for m in sent] == ["51"] and reads == [0, 50]


def test_a_keepalive_comment_when_quiet(config):
    fake = FakeTime()
    stream = EventStream(config, 0, None, clock=fake.clock, wait=fake.wait)
    assert messages(take(stream, 1)) == [{"comment": "keepalive"}]
    assert stream_module.KEEPALIVE_SECONDS <= fake.now < stream_module.KEEPALIVE_SECONDS + 1


def test_the_start_is_the_header_else_after_else_now(config):
    emit_many(config, 4)
    assert start_after(config, "2", 1) == 2
    assert start_after(config, None, 1) == 1
    assert start_after(config, None, None) == 4
    assert start_after(config, " ", None) == 4
    for bad in ("x", "-1", "1.5"):
        with pytest.raises(InvalidInput, match="Last-Event-ID"):
            start_after(config, bad, None)


def test_slots_are_bounded_and_given_back_once(config):
    slots = StreamSlots()
    streams = []
    for _ in range(2):
        slots.take(2)
        streams.append(EventStream(config, 0, None, on_close=slots.give))
    with pytest.raises(Unavailable, match="already serves 2 event streams"):
        slots.take(2)
    streams[0].close()
    streams[0].close()
    assert slots.used == 1
    slots.take(2)
    assert slots.used == 2


def test_a_full_batch_is_followed_at_once_by_the_next(config, monkeypatch):
    monkeypatch.setattr(stream_module, "BATCH", 2)
    emit_many(config, 5)
    fake = FakeTime()
    stream = EventStream(config, 0, None, clock=fake.clock, wait=fake.wait)
    sent = messages(take(stream, 3))
    assert [m["id"] for m in sent] == ["1", "2", "3", "4", "5"] and fake.sleeps == 0
