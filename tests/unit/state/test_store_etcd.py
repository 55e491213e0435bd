"""The etcd store's own logic, on the session's real cluster: members tried in turn, a
compare-and-swap whose answer was lost not written twice, bounded failure."""

from __future__ import annotations

import json
import socket
import uuid

import pytest
from etcd3gw import exceptions as etcd_errors

from provisiond.errors import InvalidConfig, StaleRevision, Unavailable
from provisiond.state import etcd
from provisiond.state.etcd import EtcdStore
from tests.etcd_cluster import free_ports


@pytest.fixture
def root():
    return f"/unit-{uuid.uuid4().hex[:12]}"


def test_a_member_that_does_not_answer_is_skipped(etcd_cluster, tmp_path, root):
    dead = free_ports(1)[0]  # nothing listens there
    url = f"etcd://127.0.0.1:{dead}," + ",".join(etcd_cluster.endpoints) + root
    store = EtcdStore(url, tmp_path / "store.key")
    revision = store.put("status/n1.json", b"up")
    assert store.get("status/n1.json").revision == revision
    since = store.revision()
    store._preferred = 0  # the dead one first again
    store.put("status/n1.json", b"down")
    store._preferred = 0
    assert [c.value for c in store.watch("status/", since, timeout=5)] == [b"down"]


def test_a_member_that_takes_connections_but_never_answers_is_left(
        etcd_cluster, tmp_path, root, monkeypatch):
    monkeypatch.setattr(etcd, "REQUEST_TIMEOUT", 1.0)
    with socket.socket() as silent:  # accepts (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = (f"etcd://127.0.0.1:{silent.getsockname()[1]},"
               + ",".join(etcd_cluster.endpoints) + root)
        store = EtcdStore(url, tmp_path / "store.key", timeout=1.0)
        since = EtcdStore(etcd_cluster.url(root), tmp_path / "store.key").put("a.json", b"1") - 1
        assert [c.value for c in store.watch("", since, timeout=0.5)] == [b"1"]
        assert store.get("a.json").value == b"1"


def test_no_member_answering_is_unavailable_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(etcd, "RETRY_FOR", 1.0)
    ports = free_ports(2)
    store = EtcdStore(f"etcd://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", tmp_path / "k")
    with pytest.raises(Unavailable, match=r"no member served the request within 1 s"):
        store.get("inventory.yaml")
    with pytest.raises(Unavailable):
        store.watch("", 0, timeout=0.1)


def test_a_write_whose_answer_was_lost_is_not_written_twice(etcd_cluster, tmp_path, root):
    """The member applied the compare-and-swap but its answer never came (it died): the
    retry on the next member must find the write done, not fail it as stale (then update
    would add the token twice)."""
    store = EtcdStore(etcd_cluster.url(root), tmp_path / "store.key")
    store.put("list.json", b"[]")
    _lose_first_answer(store, "kv/txn")
    store.update("list.json", lambda value: json.dumps(json.loads(value) + ["a"]).encode())
    assert json.loads(store.get("list.json").value) == ["a"]


def test_a_lost_answer_of_a_stale_write_is_still_stale(etcd_cluster, tmp_path, root):
    store = EtcdStore(etcd_cluster.url(root), tmp_path / "store.key")
    first = store.put("list.json", b"[]")
    store.put("list.json", b"[1]")
    _lose_first_answer(store, "kv/txn")
    with pytest.raises(StaleRevision, match=r"list.json is at revision \d+, expected "
                                            rf"at revision {first}"):
        store.put("list.json", b"[2]", expect=first)
    assert store.get("list.json").value == b"[1]"


def test_a_lost_answer_of_a_delete_is_a_delete(etcd_cluster, tmp_path, root):
    store = EtcdStore(etcd_cluster.url(root), tmp_path / "store.key")
    revision = store.put("pending/n1.json", b"x")
    _lose_first_answer(store, "kv/txn")
    assert store.delete("pending/n1.json", expect=revision) is True
    assert store.get("pending/n1.json") is None


def test_a_bad_url_is_a_config_error(tmp_path):
    with pytest.raises(InvalidConfig, match="store: 'etcd://nohost'"):
        EtcdStore("etcd://nohost", tmp_path / "k")


def _lose_first_answer(store: EtcdStore, path: str) -> None:
    """The next `path` request reaches etcd, but its answer is lost on the way back."""
    client = store.clients[store._preferred]
    post = client.post
    lost = []

    def post_then_lose(url, *args, **kwargs):
        reply = post(url, *args, **kwargs)
        if url.endswith(path) and not lost:
            lost.append(url)
            raise etcd_errors.ConnectionTimeoutError("read timed out (test)")
        return reply

    client.post = post_then_lose


@pytest.mark.parametrize("line", [b"<html>proxy error</html>", b"[" * 100_000, b"[1, 2]",
                                  b'{"result": "x"}', b'{"other": {}}'])
def test_a_watch_answer_that_is_not_etcds_is_a_member_failure(tmp_path, line):
    """A gateway that is not etcd's (a proxy's page, JSON of another shape) fails that
    member, which the call rides out like any other, never a ValueError or KeyError that
    would end the thread following the store (the boot table's watcher catches only the
    store's errors)."""
    store = EtcdStore("etcd://127.0.0.1:1", tmp_path / "k")
    with pytest.raises(etcd._Retry, match="the watch answered"):
        store._watch_message(line)
    assert store._watch_message(b'{"result": {"events": []}}') == []


def test_writers_at_once_share_one_lease_for_their_receipts(etcd_cluster, tmp_path, root):
    """A server's first guarded writes, made at once (a storm's first credentials), each
    found no lease and granted one: a lease per writer, each kept by etcd for its TTL."""
    import base64
    import threading

    store = EtcdStore(etcd_cluster.url(root), tmp_path / "store.key")
    start = threading.Barrier(20)

    def write(index: int) -> None:
        start.wait(30)
        store.put(f"status/n{index}.json", b"{}", expect=0)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    prefix = f"{root}.receipts/".encode()
    reply = store._call("kv/range", {"key": base64.b64encode(prefix).decode(),
                                     "range_end": base64.b64encode(etcd._end(prefix)).decode()})
    leases = {kv.get("lease") for kv in reply.get("kvs", [])}
    assert len(reply["kvs"]) == 20 and len(leases) == 1


def test_with_no_member_up_writers_at_once_fail_together(tmp_path, monkeypatch):
    """The receipts' lease is granted by one writer at a time: with no member up, those
    that waited for a grant that failed must fail with it, not each try in turn (the 20th
    guarded write of a storm failing after 20 times UNREACHABLE_FOR)."""
    import threading
    import time

    monkeypatch.setattr(etcd, "UNREACHABLE_FOR", 0.3)
    monkeypatch.setattr(etcd, "RETRY_FOR", 1.0)
    store = EtcdStore(f"etcd://127.0.0.1:{free_ports(1)[0]}", tmp_path / "store.key")
    start, failed = threading.Barrier(10), []

    def write(index: int) -> None:
        start.wait(30)
        began = time.monotonic()
        with pytest.raises(Unavailable):
            store.put(f"status/n{index}.json", b"{}", expect=0)
        failed.append(time.monotonic() - began)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(failed) == 10 and max(failed) < 2.0, sorted(failed)
