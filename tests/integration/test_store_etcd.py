"""The etcd store against a real 3-member cluster on loopback ports: members stopped and
the leader killed under concurrent compare-and-swap writes, secrets sealed in etcd, values
beyond the cluster's request limit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from provisiond.errors import TooLarge, Unavailable
from provisiond.state.crypt import StoreKeyError, create_key
from provisiond.state.etcd import EtcdStore
from provisiond.state.watched import WatchedCopy
from tests.etcd_cluster import ETCD, EtcdCluster, cluster_fixture, free_ports

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ETCD.is_file(), reason="needs Debian's etcd-server")]

WORKERS = 20
WRITES = 5  # per worker: 100 compare-and-swap writes on 4 keys


cluster = cluster_fixture()


@pytest.fixture
def healed(cluster):
    """Every member running again after the test (it may stop or kill some)."""
    yield cluster
    for index in range(len(cluster.members)):
        cluster.start_member(index, wait=False)
    cluster.wait_healthy()


def _store(cluster, tmp_path, root, order=None) -> EtcdStore:
    return EtcdStore(cluster.url(root, order), tmp_path / "store.key")


def test_stopping_a_member_keeps_writes_going(healed, tmp_path):
    store = _store(healed, tmp_path, f"/stop-{uuid.uuid4().hex[:8]}")
    store.put("status/n1.json", b"0")
    healed.stop_member(0)  # the first member the store names
    for _ in range(20):
        store.update("status/n1.json", lambda value: str(int(value) + 1).encode())
    assert store.get("status/n1.json").value == b"20"
    healed.stop_member(healed.leader())  # and the leader: one of three left is no quorum
    writer = threading.Thread(target=store.update,
                              args=("status/n1.json", lambda value: b"21"), daemon=True)
    healed.start_member(0, wait=False)  # back within the store's retry time
    writer.start()
    writer.join(120)
    assert store.get("status/n1.json").value == b"21"


def test_killing_the_leader_loses_no_concurrent_write_and_half_writes_none(healed, tmp_path):
    root = f"/kill-{uuid.uuid4().hex[:8]}"
    stores = [_store(healed, tmp_path, root, [0, 1, 2]), _store(healed, tmp_path, root, [2, 1, 0])]
    done: list[str] = []
    errors: list[BaseException] = []
    enough = threading.Event()

    def worker(number: int) -> None:
        store = stores[number % 2]
        for write in range(WRITES):
            token = f"w{number}-{write}"
            try:
                store.update(f"lists/{number % 4}.json", lambda value: _append(value, token),
                             wait=120)
            except BaseException as exc:  # noqa: BLE001 (any failure is the test's)
                errors.append(exc)
                return
            done.append(token)
            if len(done) >= WORKERS:
                enough.set()

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(WORKERS)]
    for thread in threads:
        thread.start()
    assert enough.wait(120), f"the writes did not start: {errors}"
    killed = healed.kill_leader()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert healed.members[killed].process.poll() == -signal.SIGKILL
    written = []
    for index in range(4):
        written += json.loads(stores[1].get(f"lists/{index}.json").value)  # whole JSON
    assert sorted(written) == sorted(done)  # each write there once, none lost
    assert len(done) == WORKERS * WRITES


def test_secret_values_are_sealed_in_etcd_and_read_back_through_the_store(cluster, tmp_path):
    root = f"/secret-{uuid.uuid4().hex[:8]}"
    store = _store(cluster, tmp_path, root)
    store.put("secrets.yaml", b"nodes: {n1: {password: hunter2}}\n")
    store.put("inventory.yaml", b"nodes: {n1: {}}\n")
    raw = cluster.etcdctl("get", f"{root}/secrets.yaml", "--print-value-only")
    assert b"hunter2" not in raw and b"nodes" not in raw and len(raw) > 30
    assert cluster.etcdctl("get", f"{root}/inventory.yaml",
                           "--print-value-only") == b"nodes: {n1: {}}\n\n"
    other = _store(cluster, tmp_path, root, [2, 0, 1])  # another server, the same key file
    assert other.get("secrets.yaml").value == b"nodes: {n1: {password: hunter2}}\n"
    assert [c.value for c in other.watch("secrets.yaml", 0, timeout=5)] == [
        b"nodes: {n1: {password: hunter2}}\n"]


def test_a_missing_or_wrong_store_key_is_one_clear_error(cluster, tmp_path):
    root = f"/wrongkey-{uuid.uuid4().hex[:8]}"
    (tmp_path / "a").mkdir()
    _store(cluster, tmp_path / "a", root).put("secrets.yaml", b"password: hunter2\n")
    (tmp_path / "b").mkdir()
    with pytest.raises(StoreKeyError, match=r"store.key is missing.*copy store.key"):
        _store(cluster, tmp_path / "b", root).get("secrets.yaml")
    assert not (tmp_path / "b" / "store.key").exists()
    create_key(tmp_path / "b" / "store.key")
    with pytest.raises(StoreKeyError, match=r"is store key \w+, but the secrets .* are "
                                            r"sealed with store key \w+"):
        _store(cluster, tmp_path / "b", root).get("secrets.yaml")
    reader = _store(cluster, tmp_path / "a", root)
    assert reader.get("secrets.yaml").value == b"password: hunter2\n"
    assert reader.get("inventory.yaml") is None  # plain keys need no key


def test_a_value_beyond_the_request_limit_is_one_clear_error(tmp_path):
    with EtcdCluster(tmp_path / "small", size=1, max_request_bytes=1 << 20) as small:
        store = EtcdStore(small.url("/big"), tmp_path / "store.key")
        revision = store.put("inventory.yaml", b"x" * (900 << 10))
        for size in (1100 << 10, 2 << 20):  # over the limit; also over gRPC's (+512 KiB)
            for expect in (None, revision):
                with pytest.raises(TooLarge, match=r"inventory.yaml: \d.\d MiB is more than "
                                                   r"the etcd cluster takes.*max-request-bytes"):
                    store.put("inventory.yaml", b"y" * size, expect=expect)
        assert store.get("inventory.yaml").value == b"x" * (900 << 10)


def test_a_cli_command_against_a_cluster_that_is_down_fails_in_one_line_at_once(tmp_path):
    """No member takes a connection: one line naming the endpoints, well before the 30 s
    a call keeps retrying members that answer (an election)."""
    ports = free_ports(2)  # nothing listens there
    url = f"etcd://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/down"
    (tmp_path / "provisiond.yaml").write_text(f"store: {url}\n")
    provisiond = Path(sys.executable).parent / "provisiond"
    done = subprocess.run([str(provisiond), "--state-dir", str(tmp_path), "node", "list"],
                          capture_output=True, text=True, timeout=20)  # RETRY_FOR is 30 s
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"provisiond: error: etcd {url}: no member took a "
                                  "connection for 5 s (")
    assert done.stderr.count("\n") == 1
    for port in ports:  # in the order the last round tried them
        assert f"127.0.0.1:{port}: connection refused" in done.stderr


def _append(value: bytes | None, token: str) -> bytes:
    items = json.loads(value) if value else []
    return json.dumps(items + [token]).encode()



def test_a_watched_copy_follows_etcd_and_fails_rather_than_answer_old_values(healed,
                                                                            tmp_path):
    """A server's copy of what it reads per request (provisiond.state.watched) on a real
    cluster: another server's change reaches it through the watch, with no read; with every
    member stopped a get fails once the copy is max_age old, not answers what etcd held."""
    root = f"/copy-{uuid.uuid4().hex[:8]}"
    ours, theirs = _store(healed, tmp_path, root), _store(healed, tmp_path, root)
    key = "secrets/nodes/n1.json"
    theirs.put(key, b"issued")
    reads = []
    real_get = ours.get
    ours.get = lambda name: reads.append(name) or real_get(name)
    copy = WatchedCopy(ours, ("secrets/",), max_age=2.0, wait=0.5)
    assert copy.get(key).value == b"issued"
    theirs.put(key, b"revoked")
    written = time.monotonic()
    while copy.get(key).value != b"revoked":
        assert time.monotonic() - written < 1.0, "the change did not come through the watch"
        time.sleep(0.01)
    assert reads == [key]
    for index in range(len(healed.members)):
        healed.stop_member(index)
    with pytest.raises(Unavailable):
        for _ in range(2000):  # answered from the copy for at most max_age, then read
            copy.get(key)
            time.sleep(0.01)
