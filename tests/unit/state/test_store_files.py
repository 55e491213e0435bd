"""The files backend beyond the contract: the state dir holds the values as plain files (modes
as before), and a file changed behind the store's back (an editor, `git pull`) is a change."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from provisiond.errors import StaleRevision
from provisiond.state.files import FilesStore, StoreFileError


@pytest.fixture
def root(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def store(root):
    return FilesStore(root)


def test_values_are_the_files_and_secrets_stay_private(store, root):
    store.put("inventory.yaml", b"nodes: {}\n")
    store.put("secrets.yaml", b"nodes: {n1: {munge.key: x}}\n")
    store.put("secrets/nodes/n1.json", b"{}")
    store.put("tokens.json", b"{}")
    store.put("jobs/3.secret", b"{}")  # a job's URL credentials (an export, imported)
    store.put("jobs/3.json", b"{}")
    assert (root / "inventory.yaml").read_bytes() == b"nodes: {}\n"
    for name in ("inventory.yaml", "jobs/3.json"):
        assert stat.S_IMODE(os.stat(root / name).st_mode) == 0o644, name
    for name in ("secrets.yaml", "secrets/nodes/n1.json", "tokens.json", "jobs/3.secret"):
        assert stat.S_IMODE(os.stat(root / name).st_mode) == 0o600, name


def test_the_change_log_holds_no_secret(store, root):
    store.put("secrets.yaml", b"password: hunter2\n")
    store.put("jobs/3.secret", b'{"image": "http://u:hunter3@h/f.bin"}')
    store.put("status/n1.json", b'{"phase": "up"}')
    log = (root / ".store" / "changes.jsonl").read_text()
    assert "hunter2" not in log and "hunter3" not in log and '\\"up\\"' in log
    assert stat.S_IMODE(os.stat(root / ".store" / "changes.jsonl").st_mode) == 0o600
    assert (root / ".store" / ".gitignore").read_text() == "*\n"


def test_a_file_edited_by_hand_is_a_new_revision(store, root):
    revision = store.put("inventory.yaml", b"nodes: {}\n")
    (root / "inventory.yaml").write_bytes(b"nodes: {n1: {}}\n")  # in place, as an editor
    with pytest.raises(StaleRevision):
        store.put("inventory.yaml", b"nodes: {n2: {}}\n", expect=revision)
    entry = store.get("inventory.yaml")
    assert entry.value == b"nodes: {n1: {}}\n" and entry.revision > revision
    store.put("inventory.yaml", b"nodes: {n2: {}}\n", expect=entry.revision)


def test_an_edit_of_the_same_size_within_the_same_tick_is_seen(store, root):
    """The stat stamp names the inode: a rename over the file (git checkout) with the same
    size and mtime still differs."""
    revision = store.put("leases.json", b"aaaa")
    stamp = os.stat(root / "leases.json")
    (root / "new").write_bytes(b"bbbb")
    os.utime(root / "new", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.replace(root / "new", root / "leases.json")
    entry = store.get("leases.json")
    assert entry.value == b"bbbb" and entry.revision > revision


def test_a_touched_file_keeps_its_revision(store, root):
    revision = store.put("inventory.yaml", b"nodes: {}\n")
    os.utime(root / "inventory.yaml", ns=(1, 1))
    assert store.get("inventory.yaml").revision == revision
    assert store.put("inventory.yaml", b"x", expect=revision) > revision


def test_files_created_and_removed_by_hand_are_changes(store, root):
    since = store.revision()
    (root / "status").mkdir(parents=True)
    (root / "status" / "n1.json").write_bytes(b"{}")
    changes = store.watch("status/", since, timeout=10)
    assert [(c.key, c.value) for c in changes] == [("status/n1.json", b"{}")]
    (root / "status" / "n1.json").unlink()
    changes = store.watch("status/", changes[-1].revision, timeout=10)
    assert [(c.key, c.value) for c in changes] == [("status/n1.json", None)]
    assert store.get("status/n1.json") is None


def test_a_hand_edit_reaches_a_watch_already_waiting(store, root):
    store.put("inventory.yaml", b"a: 1\n")
    since = store.revision()
    import threading

    edit = threading.Timer(0.3, (root / "inventory.yaml").write_bytes, (b"a: 2\n",))
    edit.start()
    try:
        changes = store.watch("inventory.yaml", since, timeout=20)
    finally:
        edit.join()
    assert [(c.key, c.value) for c in changes] == [("inventory.yaml", b"a: 2\n")]


def test_a_large_value_is_watched_from_its_file_while_it_is_current(store):
    big = b"x" * 100_000
    since = store.revision()
    first = store.put("inventory.yaml", big)
    changes = store.watch("", since, timeout=1)
    assert [(c.revision, c.value) for c in changes] == [(first, big)]
    store.put("inventory.yaml", b"small")
    changes = store.watch("", since, timeout=1)
    # the big value is gone from the file and was too long for the log: its change is
    # folded into the next one of the same key
    assert [c.value for c in changes] == [b"small"]


def test_a_crash_between_the_value_and_its_meta_is_a_new_revision(store, root):
    revision = store.put("status/n1.json", b"1")
    meta = root / ".store" / "meta" / "status" / "n1.json.rev"
    old = meta.read_bytes()
    store.put("status/n1.json", b"2")
    meta.write_bytes(old)  # the new value landed, its meta did not
    entry = store.get("status/n1.json")
    assert entry.value == b"2" and entry.revision > revision
    assert json.loads(meta.read_bytes())["rev"] == entry.revision


def test_a_log_that_lost_its_tail_never_gives_a_key_a_revision_twice(store, root):
    """After a power cut the change log (not fsynced) may end before a meta written after
    it: the key's next put got the revision its meta already held, and a writer holding
    the older value's revision then won its compare-and-swap (a lost update)."""
    store.put("status/n1.json", b"1")
    read = store.put("status/n1.json", b"2")  # a writer reads this revision
    log = root / ".store" / "changes.jsonl"
    log.write_bytes(log.read_bytes().splitlines(keepends=True)[0])  # the tail is lost
    newer = store.put("status/n1.json", b"3", expect=read)
    assert newer > read
    with pytest.raises(StaleRevision):
        store.put("status/n1.json", b"lost", expect=read)
    assert store.get("status/n1.json").value == b"3"
    assert store.revision() >= newer


def test_a_torn_log_line_does_not_take_the_revision_back(store, root):
    for number in range(3):
        revision = store.put("status/n1.json", str(number).encode())
    with open(root / ".store" / "changes.jsonl", "ab") as handle:
        handle.write(b'{"id":4,"key":"status/n2.js')  # a crash mid-append
    assert store.put("status/n2.json", b"x") > revision and store.revision() > revision
    assert [c.key for c in store.watch("", revision, 0)] == ["status/n2.json"]


def test_a_long_key_with_a_value_near_the_line_bound_is_stored_and_logged(store, root):
    """The value went into the change log's line when it fitted a bound that left 512
    bytes for the rest of the line: with a long key the line was over the journal's limit,
    and the put raised ValueError (a traceback) after the file was replaced."""
    key = "/".join(['"' * 200] * 4) + ".json"  # each '"' is two bytes in the line
    before = store.revision()
    value = b"a" * 15_800
    revision = store.put(key, value)
    assert store.get(key) == store.list(key)[0] and store.get(key).value == value
    assert [(c.key, c.revision, c.value) for c in store.watch("", before, 0)] == [
        (key, revision, value)]


def test_a_watch_from_before_the_log_was_removed_is_compacted(store, root):
    """`git clean -X` of a state dir kept in git removes .store/: revisions start again
    low, and a watch from the old revision (serve's table) waited for ever for a change
    above it."""
    import shutil

    from provisiond.state.store import Compacted

    for number in range(5):
        store.put("inventory.yaml", str(number).encode())
    since = store.revision()
    shutil.rmtree(root / ".store")
    store.put("inventory.yaml", b"edited after the clean")
    with pytest.raises(Compacted):
        store.watch("inventory.yaml", since, 0.5)
    assert store.watch("inventory.yaml", store.revision(), 0) == []


def test_dot_files_beside_values_are_not_keys(store, root):
    store.put("status/n1.json", b"1")
    (root / "status" / ".n2.json.tmp").write_bytes(b"half")
    assert [entry.key for entry in store.list("")] == ["status/n1.json"]


def test_only_documents_are_listed(store, root):
    """No FIFO (an image tree's /dev/initctl would block a read), no layer tree, no blob."""
    store.put("status/n1.json", b"1")
    os.mkfifo(root / "status" / "n2.json")
    for folder in ("cache/layers/abc/etc", "blobs/sha256"):
        (root / folder).mkdir(parents=True)
    (root / "cache/layers/abc/etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "blobs/sha256/0123").write_bytes(b"blob")
    assert [entry.key for entry in store.list("")] == ["status/n1.json"]
    assert store.get("status/n2.json") is None
    assert store.watch("", store.revision(), timeout=0.1) == []


def test_a_file_in_the_way_or_an_unwritable_dir_is_one_line(store, root):
    store.put("inventory.yaml", b"a")
    with pytest.raises(StoreFileError, match=r"put inventory.yaml/x: .*inventory.yaml"):
        store.put("inventory.yaml/x", b"b")
    (root / "status").mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anyway
        with pytest.raises(StoreFileError, match=r"Permission denied"):
            store.put("status/n1.json", b"{}")


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to another user (needs root)")
def test_a_reader_that_may_not_write_still_reads_a_hand_edited_file():
    import shutil
    import subprocess
    import sys
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="pvstore-"))  # 0700 pytest dirs keep others out
    try:
        top.chmod(0o755)
        store = FilesStore(top / "state")
        store.put("inventory.yaml", b"a: 1\n")
        (top / "state" / "inventory.yaml").write_bytes(b"a: 2\n")  # not yet registered
        script = ("import sys; from provisiond.state.files import FilesStore\n"
                  "print(FilesStore(sys.argv[1]).get('inventory.yaml').value.decode(), end='')")
        reply = subprocess.run(["/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534",
                                "--clear-groups", sys.executable, "-c", script,
                                str(top / "state")], capture_output=True, text=True,
                               timeout=60, cwd=str(Path(__file__).resolve().parents[3]))
        assert (reply.returncode, reply.stdout) == (0, "a: 2\n"), reply.stderr
        assert store.get("inventory.yaml").revision > 1  # a writer registers it
    finally:
        shutil.rmtree(top)


def test_a_half_written_meta_counts_as_none_never_as_a_wrong_revision(store, root):
    revision = store.put("status/n1.json", b"1")
    meta = root / ".store" / "meta" / "status" / "n1.json.rev"
    old = meta.read_bytes()
    store.put("status/n1.json", b"2")
    new = meta.read_bytes()
    meta.write_bytes(old[:40] + new[40:])  # a read meeting a write: the new stat, old rev
    entry = store.get("status/n1.json")
    assert entry.value == b"2" and entry.revision > revision + 1
    with pytest.raises(StaleRevision):
        store.put("status/n1.json", b"3", expect=revision + 1)


def test_a_watch_of_a_quiet_prefix_reads_each_change_of_others_once(store, monkeypatch):
    """serve's watch of inventory.yaml (a call a second, a poll of the log every 0.1 s) read
    every change made since the inventory's last one, the phases of every storm since, at
    each poll: 10-25% of a core on an idle server after a few storms."""
    since = store.put("inventory.yaml", b"one")
    for index in range(50):
        store.put(f"status/n{index}.json", b"{}")
    latest = store.revision()
    starts = []
    real = store.log.read_since
    monkeypatch.setattr(store.log, "read_since",
                        lambda after_id, **kw: starts.append(after_id) or real(after_id, **kw))
    assert store.watch("inventory.yaml", since, 0.35) == []
    assert store.watch("inventory.yaml", since, 0.35) == []  # the caller's next call
    assert starts[0] == since and set(starts[1:]) == {latest} and len(starts) > 2
    revision = store.put("inventory.yaml", b"two")
    assert [change.value for change in store.watch("inventory.yaml", since, 5)] == [b"two"]
    assert store.watch("inventory.yaml", revision, 0) == []
