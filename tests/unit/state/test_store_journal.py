"""Events and the audit record on a shared store (etcd's semantics, here the dict-backed
store): every server's records in one sequence, read by the store's watch, bounded."""

from __future__ import annotations

import threading

from provisiond import audit, events
from provisiond.api.v1.events import EventStream
from provisiond.journal import Journal, StoreJournal, journal_on
from tests.memstore import MemoryStore
from tests.unit.api.test_event_stream import messages, take


def test_the_files_store_keeps_todays_journal_files(config):
    from provisiond.state.files import FilesStore

    chosen = journal_on(FilesStore(config.state_dir), "events/", events.events_path(config),
                        1 << 20, 1 << 19)
    assert isinstance(chosen, Journal) and chosen.path == events.events_path(config)


def test_events_of_two_servers_are_one_sequence_by_store_revision(config, store):
    assert isinstance(events.journal(config), StoreJournal)
    first = events.emit(config, "node.phase", "n1", {"phase": "dhcp"})
    store.put("status/n1.json", b"{}")  # other keys share the revision counter
    second = events.emit(config, "node.phase", "n2", {"phase": "dhcp"})
    assert first < second == store.revision()
    found = events.read_since(config, 0)
    assert [(e.id, e.subject) for e in found] == [(first, "n1"), (second, "n2")]
    assert [e.subject for e in events.read_since(config, first)] == ["n2"]
    assert events.read_since(config, 0, kinds=frozenset({"job."})) == []
    assert not config.state_dir.joinpath("events").exists()  # nothing written locally


def test_audit_entries_are_on_the_store(config, store):
    seq = audit.record(config, "cli:root", "node.add", "n1", ["mac"])
    assert audit.read(config)[0]["seq"] == seq and store.list("audit/")


def test_a_wait_returns_when_another_server_emits(config, store):
    after = events.latest_id(config)
    emitter = threading.Timer(0.2, lambda: events.emit(config, "job.started", "job/1"))
    emitter.start()
    try:
        assert events.wait(config, after, timeout=30)
    finally:
        emitter.join()
    assert [e.kind for e in events.read_since(config, after)] == ["job.started"]
    assert events.wait(config, events.latest_id(config), timeout=0.1) is False


def test_old_records_are_deleted_and_the_loss_is_told(config, store):
    journal = StoreJournal(store, "events/", keep=10)
    ids = [journal.append({"kind": "test.tick", "time": 0, "data": {"i": i}})
           for i in range(25)]
    journal.trim()
    assert len(store.list("events/")) == 10
    assert ids[14] < journal.oldest_id() <= ids[15]
    store.compact(store.revision())  # etcd's history gone too: the keys are what is left
    assert [r["id"] for r in journal.read_since(0)] == ids[15:]


def test_the_sse_stream_follows_the_store(config, store, monkeypatch):
    monkeypatch.setattr(events, "KEEP_RECORDS", 10)
    for i in range(25):
        events.emit(config, "test.tick", f"s{i}")
    events.journal(config).trim()
    oldest = events.oldest_id(config)
    store.compact(store.revision())
    sent = messages(take(EventStream(config, 3, None), 1))
    assert sent[0]["data"]["kind"] == "stream.gap"
    assert sent[0]["data"]["data"]["oldest_id"] == oldest
    assert len(sent[1:]) == 10 and int(sent[1]["id"]) >= oldest
    late = threading.Timer(0.2, lambda: events.emit(config, "test.late"))
    stream = iter(EventStream(config, events.latest_id(config), None))
    next(stream)  # retry:
    late.start()
    try:
        assert [m["data"]["kind"] for m in messages([next(stream)])] == ["test.late"]
    finally:
        late.join()
