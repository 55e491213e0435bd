"""The store contract: the same tests run against the files backend and a real 3-member etcd
cluster (tests/etcd_cluster.py), so either can stand behind provisiond.state.store.Store."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from provisiond.errors import InvalidInput, StaleRevision
from provisiond.state.store import ABSENT, Change, Compacted, Store
from tests.conftest import REPO
from tests.unit.state.stores import BACKENDS, compact, increment


@pytest.fixture(params=BACKENDS)
def backend(request):
    """(store, url, key_path): a new, empty store of each backend."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def store(backend) -> Store:
    return backend[0]


def test_a_missing_key_is_none(store):
    assert store.get("inventory.yaml") is None
    assert store.list("status/") == []


def test_put_then_get_gives_the_exact_bytes_and_revision(store):
    value = b"nodes:\n  n1: {}\n\xff\x00binary"
    revision = store.put("inventory.yaml", value)
    entry = store.get("inventory.yaml")
    assert (entry.key, entry.value, entry.revision) == ("inventory.yaml", value, revision)


def test_compare_and_swap_replaces_only_the_expected_revision(store):
    first = store.put("status/n1.json", b"1")
    second = store.put("status/n1.json", b"2", expect=first)
    assert second > first
    with pytest.raises(StaleRevision):
        store.put("status/n1.json", b"3", expect=first)
    assert store.get("status/n1.json").value == b"2"
    assert store.get("status/n1.json").revision == second


def test_absent_only_creates(store):
    revision = store.put("tokens.json", b"{}", expect=ABSENT)
    with pytest.raises(StaleRevision):
        store.put("tokens.json", b"{\"other\": 1}", expect=ABSENT)
    assert store.get("tokens.json").value == b"{}"
    assert store.get("tokens.json").revision == revision
    with pytest.raises(StaleRevision):
        store.put("absent.json", b"x", expect=revision)
    assert store.get("absent.json") is None


def test_delete_with_expect(store):
    revision = store.put("leases.json", b"{}")
    with pytest.raises(StaleRevision):
        store.delete("leases.json", expect=revision + 100)
    with pytest.raises(StaleRevision):
        store.delete("leases.json", expect=ABSENT)
    assert store.get("leases.json") is not None
    assert store.delete("leases.json", expect=revision) is True
    assert store.get("leases.json") is None
    assert store.delete("leases.json") is False
    with pytest.raises(StaleRevision):
        store.delete("leases.json", expect=revision)


def test_list_gives_a_prefix_sorted_by_key(store):
    for name in ["n10", "n2", "n1", "m1"]:
        store.put(f"status/{name}.json", name.encode())
    store.put("statusx.json", b"not under status/")
    store.put("status/deep/n0.json", b"deeper")
    keys = [entry.key for entry in store.list("status/")]
    assert keys == ["status/deep/n0.json", "status/m1.json", "status/n1.json",
                    "status/n10.json", "status/n2.json"]
    assert [entry.key for entry in store.list("status/n1")] == ["status/n1.json",
                                                                "status/n10.json"]
    assert {entry.value for entry in store.list("status/n")} == {b"n1", b"n10", b"n2"}
    assert "statusx.json" in [entry.key for entry in store.list("")]


def test_revisions_grow_with_every_change(store):
    start = store.revision()
    one = store.put("a.json", b"1")
    two = store.put("b.json", b"2")
    store.delete("a.json")
    assert start < one < two < store.revision()
    assert store.get("b.json").revision == two


def test_watch_sees_every_change_in_order_deletes_included(store):
    since = store.revision()
    one = store.put("status/n1.json", b"booting")
    store.put("inventory.yaml", b"not watched")
    two = store.put("status/n1.json", b"up")
    store.delete("status/n1.json")
    three = store.put("status/n2.json", b"up")
    changes = _watch_all(store, "status/", since, count=4)
    assert [(c.key, c.value) for c in changes] == [
        ("status/n1.json", b"booting"), ("status/n1.json", b"up"),
        ("status/n1.json", None), ("status/n2.json", b"up")]
    revisions = [c.revision for c in changes]
    assert revisions == sorted(revisions) and len(set(revisions)) == 4
    assert (revisions[0], revisions[1], revisions[3]) == (one, two, three)
    assert store.watch("status/", revisions[-1], timeout=0.2) == []


def test_a_watch_without_wait_still_hands_over_what_is_there(store):
    since = store.revision()
    revision = store.put("status/n1.json", b"up")
    assert [(c.key, c.revision) for c in store.watch("status/", since, timeout=0)] == [
        ("status/n1.json", revision)]


def test_watch_waits_for_a_change_made_meanwhile(store):
    since = store.revision()
    writer = threading.Timer(0.3, store.put, ("status/n9.json", b"late"))
    writer.start()
    try:
        changes = store.watch("status/", since, timeout=20)
    finally:
        writer.join()
    assert [(c.key, c.value) for c in changes] == [("status/n9.json", b"late")]


def test_watch_times_out_with_nothing(store):
    store.put("other.json", b"1")
    assert store.watch("status/", store.revision(), timeout=0.3) == []


def test_watch_from_a_compacted_revision_says_so(store):
    since = store.revision()
    store.put("status/n1.json", b"1")
    compact(store)
    with pytest.raises(Compacted):
        store.watch("status/", since, timeout=1)
    assert store.watch("status/", store.revision(), timeout=0.1) == []


@pytest.mark.parametrize("key", ["/etc/passwd", "../x", "a/../b", "a//b", "", "a/", ".store/x",
                                 "status/.hidden", "a\x00b"])
def test_bad_keys_are_refused(store, key):
    with pytest.raises(InvalidInput):
        store.put(key, b"x")
    with pytest.raises(InvalidInput):
        store.get(key)


def test_update_from_threads_loses_no_increment(store):
    threads = [threading.Thread(target=increment, args=(store, "counter", 25))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert store.get("counter").value == b"100"


def test_update_from_processes_loses_no_increment(backend):
    store, url, key_path = backend
    script = ("import sys; from provisiond.state.open import open_url\n"
              "from tests.unit.state.stores import increment\n"
              "increment(open_url(sys.argv[1], sys.argv[2]), 'counter', int(sys.argv[3]))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, url, str(key_path), "20"],
                              cwd=REPO) for _ in range(3)]
    increment(store, "counter", 20)
    for proc in procs:
        assert proc.wait(timeout=180) == 0
    assert store.get("counter").value == b"80"


def test_update_deletes_when_the_change_says_none(store):
    store.put("pending/n1.json", b"x")
    assert store.update("pending/n1.json", lambda value: None) is None
    assert store.get("pending/n1.json") is None
    assert store.update("pending/n1.json", lambda value: None) is None


def _watch_all(store: Store, prefix: str, since: int, count: int) -> list[Change]:
    """Watch until `count` changes came (a bounded number of rounds)."""
    changes: list[Change] = []
    for _ in range(20):
        found = store.watch(prefix, since, timeout=5)
        changes += found
        since = found[-1].revision if found else since
        if len(changes) >= count:
            break
    return changes
