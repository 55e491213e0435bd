"""A server's copy of what it reads per request (provisiond.state.watched): read once, then
kept current by the store's watch; never older than max_age when the watch fails or hangs;
a store away fails the read rather than answering an old value."""

from __future__ import annotations

import threading
import time

import pytest

from provisiond.errors import Unavailable
from provisiond.state.files import FilesStore
from provisiond.state.watched import WatchedCopy, follow
from tests.memstore import RemoteMemoryStore

KEY = "secrets/nodes/n1.json"
MAX_AGE = 0.4


@pytest.fixture
def remote():
    store = RemoteMemoryStore()
    yield store
    store.watch_error = None
    store.watch_released.set()  # a test's held watch ends with it


@pytest.fixture
def copy(remote):
    return WatchedCopy(remote, ("secrets/", "inventory.yaml"), max_age=MAX_AGE, wait=0.1)


def answers(copy: WatchedCopy, key: str, value: bytes | None, seconds: float = 10) -> float:
    """Seconds until the copy answers `value` for `key` (a bounded wait)."""
    started = time.monotonic()
    while True:
        entry = copy.get(key)
        if (entry.value if entry else None) == value:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, f"{key} still {entry}"
        time.sleep(0.01)


def test_a_key_is_read_once_then_answered_from_the_copy(remote, copy):
    remote.put(KEY, b"one")
    assert all(copy.get(KEY).value == b"one" for _ in range(200))
    time.sleep(3 * MAX_AGE)  # the watch keeps proving it current: still no read
    assert copy.get(KEY).value == b"one"
    assert remote.reads[KEY] == 1


def test_a_change_made_elsewhere_reaches_the_copy_through_the_watch(remote, copy):
    remote.put(KEY, b"one")
    assert copy.get(KEY).value == b"one"
    remote.put(KEY, b"two")
    assert answers(copy, KEY, b"two") < MAX_AGE  # the watch, not the age fallback
    remote.delete(KEY)
    answers(copy, KEY, None)
    assert copy.get(KEY) is None
    assert remote.reads[KEY] == 1


def test_an_absent_key_is_kept_absent_until_it_is_made(remote, copy):
    assert copy.get(KEY) is None and copy.get(KEY) is None
    remote.put(KEY, b"made")
    answers(copy, KEY, b"made")
    assert remote.reads[KEY] == 1


@pytest.mark.parametrize("broken", ["failing", "hanging"])
def test_with_the_watch_broken_no_answer_is_older_than_max_age(remote, copy, broken):
    """A revoked credential must not be accepted for ever by a server whose watch broke:
    the copy reads the store again, each key at most once per max_age."""
    remote.put(KEY, b"issued")
    assert copy.get(KEY).value == b"issued"
    if broken == "failing":
        remote.watch_error = Unavailable("etcd: no member served the request")
    else:
        remote.watch_released.clear()
    time.sleep(0.3)  # the loop is in its broken call
    remote.put(KEY, b"revoked")
    written = time.monotonic()
    answers(copy, KEY, b"revoked", seconds=5)
    assert time.monotonic() - written <= MAX_AGE + 0.3
    reads = remote.reads[KEY]
    asked = time.monotonic()
    while time.monotonic() - asked < 4 * MAX_AGE:
        assert copy.get(KEY).value == b"revoked"
        time.sleep(0.005)
    assert remote.reads[KEY] - reads <= 5  # about one per max_age, not one per get


def test_a_store_away_fails_the_read_rather_than_answering_an_old_value(remote, copy,
                                                                      monkeypatch):
    remote.put(KEY, b"issued")
    assert copy.get(KEY).value == b"issued"
    remote.watch_error = Unavailable("etcd: no member served the request")

    def away(key):
        raise Unavailable("etcd: no member served the request")

    monkeypatch.setattr(remote, "get", away)
    time.sleep(MAX_AGE + 0.3)
    with pytest.raises(Unavailable):
        copy.get(KEY)


def test_greenlets_asking_for_a_key_at_once_share_one_read(remote, copy, monkeypatch):
    remote.put(KEY, b"one")
    real_get = remote.get

    def slow(key):
        time.sleep(0.2)
        return real_get(key)

    monkeypatch.setattr(remote, "get", slow)
    got = []
    threads = [threading.Thread(target=lambda: got.append(copy.get(KEY).value))
               for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert got == [b"one"] * 20
    assert remote.reads[KEY] == 1


def test_after_a_compacted_watch_the_keys_are_read_again(remote, copy):
    remote.put(KEY, b"one")
    assert copy.get(KEY).value == b"one"
    remote.watch_released.clear()
    time.sleep(0.3)  # the loop waits in its call, from before the change
    remote.put(KEY, b"two")
    remote.compact(remote.revision())
    remote.watch_released.set()
    answers(copy, KEY, b"two")
    assert remote.reads[KEY] == 2


def test_a_prefix_nobody_asks_for_is_no_longer_followed(remote):
    copy = WatchedCopy(remote, ("secrets/",), max_age=MAX_AGE, wait=0.05, idle=0.3)
    remote.put(KEY, b"one")
    assert copy.get(KEY).value == b"one"
    deadline = time.monotonic() + 10
    while copy._followed:
        assert time.monotonic() < deadline, "still watching"
        time.sleep(0.05)
    watches = remote.watches
    time.sleep(0.3)
    assert remote.watches == watches  # an idle server sends the store nothing
    remote.put(KEY, b"two")
    assert copy.get(KEY).value == b"two"  # read anew, and followed again
    assert remote.reads[KEY] == 2 and copy._followed


def test_keys_under_no_prefix_are_read_from_the_store(remote, copy):
    remote.put("status/n1.json", b"{}")
    copy.get("status/n1.json")
    copy.get("status/n1.json")
    assert remote.reads["status/n1.json"] == 2 and not copy._followed


def test_only_a_remote_store_is_followed(tmp_path, remote):
    files = FilesStore(tmp_path / "state")
    assert follow(files) is files  # a read is a stat and a small file: nothing to save
    assert isinstance(follow(remote), WatchedCopy)


def test_a_change_the_watch_passed_over_during_a_read_is_not_missed(remote, copy,
                                                                     monkeypatch):
    """The read found the old value; meanwhile the watch handed the new one over, while the
    key was not kept yet (so it was passed over): the old value must not live on."""
    remote.put(KEY, b"old")
    real_get, found, release = remote.get, threading.Event(), threading.Event()

    def read_then_wait(key):
        entry = real_get(key)
        found.set()
        release.wait(30)
        return entry

    monkeypatch.setattr(remote, "get", read_then_wait)
    reader = threading.Thread(target=copy.get, args=(KEY,))
    reader.start()
    assert found.wait(30)
    revision = remote.put(KEY, b"new")
    deadline = time.monotonic() + 10
    while copy._followed["secrets/"].since < revision:  # the watch is past the change
        assert time.monotonic() < deadline
        time.sleep(0.01)
    release.set()
    reader.join(30)
    assert answers(copy, KEY, b"new", seconds=MAX_AGE + 1) <= MAX_AGE + 0.2


def failures_at_once(copy, callers: int) -> list[float]:
    """`callers` threads asking for KEY at once, each expecting Unavailable: the seconds
    each took to fail."""
    failed = []

    def ask() -> None:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            copy.get(KEY)
        failed.append(time.monotonic() - started)

    threads = [threading.Thread(target=ask) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return failed


def test_with_the_store_away_requests_fail_together_not_one_after_another(remote, copy,
                                                                          monkeypatch):
    """A storm met a store that was away while no prefix was followed (a worker just
    started, or idle for a minute): each request waited for the one before it to fail to
    start the watch (etcd: 5 s with no member up, 30 s without a leader), then failed in
    turn: the 20th after 20 times that."""
    def away(*args):
        time.sleep(0.3)  # a store that takes its time to fail
        raise Unavailable("etcd: no member served the request")

    monkeypatch.setattr(remote, "revision", away)
    monkeypatch.setattr(remote, "get", away)
    failed = failures_at_once(copy, 20)
    assert len(failed) == 20 and max(failed) < 2.0, sorted(failed)


def test_with_the_store_away_the_readers_of_a_key_share_its_failed_read(remote, copy,
                                                                        monkeypatch):
    """The watch failing and the copy past max_age: the callers that asked for one key at
    once (the inventory's revision, read with every request) waited each for the one
    before to fail its read, then read in turn: a worker's requests, one after another."""
    remote.put(KEY, b"issued")
    assert copy.get(KEY).value == b"issued"
    remote.watch_error = Unavailable("etcd: no member served the request")

    def away(key):
        time.sleep(0.3)
        raise Unavailable("etcd: no member served the request")

    monkeypatch.setattr(remote, "get", away)
    time.sleep(MAX_AGE + 0.3)
    failed = failures_at_once(copy, 20)
    assert len(failed) == 20 and max(failed) < 2.0, sorted(failed)


def test_a_watch_that_hands_over_part_of_its_backlog_proves_nothing_yet(remote, copy):
    """etcd hands a watch from an older revision its changes 1,000 revisions at a time. A
    watch back after an outage took the first thousand as proof that the copy had every
    change made before the call: a credential revoked during the outage (its key not asked
    meanwhile, so not read again) was accepted until the later calls caught up, past
    max_age after the revocation."""
    remote.batch_revisions = 1000
    remote.put(KEY, b"issued")
    assert copy.get(KEY).value == b"issued"
    remote.watch_released.clear()  # the outage
    time.sleep(0.3)
    for index in range(2500):  # a storm's credentials meanwhile
        remote.put(f"secrets/nodes/s{index}.json", b"{}")
    revoked = remote.put(KEY, b"revoked")
    time.sleep(MAX_AGE + 0.1)  # older than max_age: the copy must not answer `issued`
    remote.watch_delay = MAX_AGE / 3  # each call of the catching up takes its time
    remote.watch_released.set()
    followed = copy._followed["secrets/"]
    deadline = time.monotonic() + 10
    while followed.since < 2000:  # two thousand applied, the second call's begun after
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert followed.since < revoked
    assert copy.get(KEY).value == b"revoked"
