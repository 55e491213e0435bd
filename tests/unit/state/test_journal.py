"""The journal under events and audit: consecutive ids across processes, trimming, bisecting
reads, half-written lines; emit never failing its caller."""

from __future__ import annotations

import json
import multiprocessing
import os
import random

import pytest

from provisiond import audit, events
from provisiond.journal import MAX_LINE, Journal
from provisiond.states import NodePhase
from provisiond.status import record_phase


def _append_many(path: str, count: int) -> None:
    journal = Journal(path, 1 << 30, 1 << 29)
    for i in range(count):
        journal.append({"pid": os.getpid(), "i": i})


def test_ids_are_consecutive_across_processes(tmp_path):
    path = str(tmp_path / "j.jsonl")
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_append_many, args=(path, 150)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    records = Journal(path, 1 << 30, 1 << 29).read_since(0, 10_000)
    assert [r["id"] for r in records] == list(range(1, 601))
    per_writer = {}
    for record in records:
        per_writer.setdefault(record["pid"], []).append(record["i"])
    assert sorted(per_writer.values()) == [list(range(150))] * 4  # none lost, in order


def test_trim_keeps_the_newest_and_ids_keep_growing(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", 20_000, 10_000)
    for i in range(2_000):
        journal.append({"i": i, "pad": "x" * 40})
    assert journal.path.stat().st_size <= 20_000
    assert journal.latest_id() == 2_000
    oldest = journal.oldest_id()
    assert 1 < oldest < 2_000
    records = journal.read_since(0, 10_000)
    assert [r["id"] for r in records] == list(range(oldest, 2_001))


def test_bisected_read_matches_a_scan(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", 1 << 30, 1 << 29)
    rng = random.Random(7)
    for i in range(3_000):  # lines of varied length, the file many times MAX_LINE
        journal.append({"pad": "y" * rng.randrange(0, 400)})
    assert journal.path.stat().st_size > 20 * MAX_LINE
    for after in [0, 1, 2, 17, 1_499, 1_500, 2_998, 2_999, 3_000, 5_000]:
        got = journal.read_since(after, 5)
        assert [r["id"] for r in got] == list(range(after + 1, min(after + 6, 3_001)))


def test_a_half_written_last_line_is_not_read(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", 1 << 20, 1 << 19)
    journal.append({"a": 1})
    with open(journal.path, "ab") as handle:
        handle.write(b'{"id":2,"a"')
    assert [r["id"] for r in journal.read_since(0)] == [1]
    assert journal.latest_id() == 1


def test_a_torn_or_zeroed_last_line_does_not_restart_the_ids(tmp_path):
    """A crash mid-append (or a power cut leaving zeros) leaves a last line that is no
    record: the next append read it as id 0 and wrote id 1 (into the torn line, so the
    one after it wrote 1 again)."""
    journal = Journal(tmp_path / "j.jsonl", 1 << 20, 1 << 19)
    journal.append({"a": 1})
    journal.append({"a": 2})
    for garbage in (b'{"id":3,"a"', b"\x00" * 300, b"\x00" * 300 + b"\n",
                    b"\x00" * 40_000 + b"\n"):  # zeros past the tail read first
        with open(journal.path, "ab") as handle:
            handle.write(garbage)
        last = journal.latest_id()
        assert journal.append({"b": 1}) == last + 1 and journal.append({"b": 2}) == last + 2
    assert [r["id"] for r in journal.read_since(0)] == list(range(1, 11))


def test_a_line_that_is_no_record_does_not_hide_the_records_before_it(tmp_path):
    """The bisect took a line without an id (zeros after a power cut, a torn line) for one
    at id 0 and started reading after it: records before it were skipped."""
    journal = Journal(tmp_path / "j.jsonl", 1 << 30, 1 << 29)
    for number in range(600):  # a line of zeros after each record: every probe meets one
        journal.append({"n": number, "pad": "x" * 100})
        with open(journal.path, "ab") as handle:
            handle.write(b"\x00" * 50 + b"\n")
    for after in range(0, 600, 7):
        assert [r["id"] for r in journal.read_since(after, 3)] == [
            i for i in range(after + 1, after + 4) if i <= 600], after


def test_an_oversize_record_is_refused_and_nothing_written(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", 1 << 20, 1 << 19)
    with pytest.raises(ValueError, match="bytes"):
        journal.append({"big": "z" * MAX_LINE})
    assert journal.latest_id() == 0


def test_emit_never_fails_its_caller(config):
    config.state_dir.joinpath("events").write_text("a file where the directory goes")
    assert events.emit(config, "node.phase", "n1", {"phase": "dhcp"}) is None
    record_phase(config, "n1", NodePhase.DHCP)  # the boot phase is still recorded


def test_phases_become_events_and_kinds_filter(config):
    record_phase(config, "n1", NodePhase.DHCP)
    events.emit(config, "job.started", None, {"id": "j1"})
    record_phase(config, "n1", NodePhase.IPXE, "script")
    found = events.read_since(config, 0)
    assert [(e.kind, e.subject, e.data.get("phase")) for e in found] == [
        ("node.phase", "n1", "dhcp"), ("job.started", None, None), ("node.phase", "n1", "ipxe")]
    jobs = events.read_since(config, 0, kinds=frozenset({"job."}))
    assert [e.kind for e in jobs] == ["job.started"]
    assert events.latest_id(config) == 3 and events.oldest_id(config) == 1


def test_audit_records_are_private_and_filtered(config):
    audit.record(config, "cli:root", "node.create", "n1", ["netdevs.eth0.mac"])
    audit.record(config, "token:netbox", "node.update", "n2", ["tags.rack"])
    audit.record(config, "cli:root", "node.delete", "n2")
    assert audit.audit_path(config).stat().st_mode & 0o777 == 0o600
    assert [e["seq"] for e in audit.read(config, target="n2")] == [2, 3]
    mine = audit.read(config, actor="cli:root", after=1)
    assert [(e["seq"], e["action"], e["changes"]) for e in mine] == [(3, "node.delete", [])]
    assert json.loads(audit.audit_path(config).read_text().splitlines()[0])["id"] == 1
