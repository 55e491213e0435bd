"""Serve's boot table follows inventory.yaml through the store's watch: a change made by
another process (the CLI) is picked up without a look at the file's stat."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from provisiond.boot.table import TableWatcher
from tests.unit.boot.bootdata import add_nodes, mac_of


def _wait_for(watcher: TableWatcher, node: str, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watcher.wait_changed(timeout=1.0)
        if node in watcher.table.nodes:
            return True
    return False


def test_a_cli_node_add_reaches_the_watching_table(config, state_dir):
    add_nodes(config, 1)
    watcher = TableWatcher(config, interval=3600)  # changed() would look only in an hour
    assert set(watcher.table.nodes) == {"n1"}
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir))
    subprocess.run([sys.executable, "-m", "provisiond", "node", "add", "n9",
                    "--mac", mac_of(9), "--ipaddr", "10.99.0.50"],
                   env=env, check=True, capture_output=True, timeout=120)
    assert _wait_for(watcher, "n9")
    assert watcher.table.by_mac[mac_of(9)].node == "n9"


def test_a_watch_with_nothing_new_rebuilds_nothing(config, store):
    add_nodes(config, 1)
    watcher = TableWatcher(config)
    table = watcher.table
    store.put("status/n1.json", b"{}")  # another key
    assert watcher.wait_changed(timeout=0.2) is False and watcher.table is table
    store.put("inventory.yaml.schema-0.bak", b"x")  # a key that shares its start
    assert watcher.wait_changed(timeout=0.2) is False and watcher.table is table


def test_a_compacted_watch_compares_revisions(config, store):
    add_nodes(config, 1)
    watcher = TableWatcher(config)
    add_nodes(config, 2)
    store.compact(store.revision())
    assert watcher.wait_changed(timeout=0.2) is True and set(watcher.table.nodes) == {"n1", "n2"}


def test_a_store_away_when_the_change_is_read_keeps_the_table_and_the_change(config, store,
                                                                            monkeypatch):
    """The watch saw a change, then the get failed (etcd away for its 30 s of retries, an
    unreadable file): wait_changed raised, which ended serve's supervisor loop, and the
    revision was already taken as seen, so the change was not loaded once the store was
    back."""
    from provisiond.errors import Unavailable

    add_nodes(config, 1)
    watcher = TableWatcher(config)
    table = watcher.table
    add_nodes(config, 2)
    real_get = store.get

    def away(key):
        raise Unavailable("etcd etcd://127.0.0.1:1: no member served the request")

    monkeypatch.setattr(store, "get", away)
    assert watcher.wait_changed(timeout=0.2) is False and watcher.table is table
    assert watcher.changed() is False and watcher.table is table
    monkeypatch.setattr(store, "get", real_get)
    assert watcher.wait_changed(timeout=0.2) is True
    assert set(watcher.table.nodes) == {"n1", "n2"}


def _slowed(monkeypatch, store, delay: float) -> list:
    """Every get of the store takes `delay` s (an etcd round trip); the builds of the
    table are counted (the list returned)."""
    from provisiond.boot import table as table_module

    real_get, real_build, builds = store.get, table_module.build_table, []

    def slow_get(key):
        time.sleep(delay)
        return real_get(key)

    def counted_build(*args, **kwargs):
        builds.append(time.monotonic())
        return real_build(*args, **kwargs)

    monkeypatch.setattr(store, "get", slow_get)
    monkeypatch.setattr(table_module, "build_table", counted_build)
    return builds


def test_requests_that_meet_a_change_at_once_rebuild_the_table_once(config, store,
                                                                    monkeypatch):
    """On etcd a worker compares the revision with every request (interval 0): the
    requests of a storm that met an inventory change at once each read the inventory and
    rebuilt the table (1-3 s of a core each with 10,000 nodes)."""
    import threading

    add_nodes(config, 1)
    watcher = TableWatcher(config, interval=0.0)
    add_nodes(config, 2)
    builds = _slowed(monkeypatch, store, 0.05)
    threads = [threading.Thread(target=watcher.current) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(builds) == 1
    assert set(watcher.current().nodes) == {"n1", "n2"}


def test_a_slow_rebuild_does_not_replace_a_later_one(config, store, monkeypatch):
    """Two changes in a row, the first one's rebuild the slower: it ended last and put its
    older table back, and with the later revision taken as seen, the later change was
    never loaded (a node added then got 404 until the next inventory change)."""
    import threading

    from provisiond.boot import table as table_module

    add_nodes(config, 1)
    watcher = TableWatcher(config, interval=0.0)
    real_build, first = table_module.build_table, threading.Event()

    def build(*args, **kwargs):
        table = real_build(*args, **kwargs)
        if not first.is_set():
            first.set()
            time.sleep(0.5)  # the older inventory's table, slow to come
        return table

    monkeypatch.setattr(table_module, "build_table", build)
    add_nodes(config, 2)
    slow = threading.Thread(target=watcher.current)
    slow.start()
    assert first.wait(30)
    add_nodes(config, 3)
    watcher.current()
    slow.join(30)
    assert set(watcher.current().nodes) == {"n1", "n2", "n3"}


def test_after_a_compaction_past_the_inventorys_revision_the_watch_waits_again(config, store):
    """etcd compacted (docs/store.md: --auto-compaction-retention 10000, a storm's status
    writes pass that) past the inventory's last change: each watch from that revision was
    Compacted at once, and serve's loop watched again at once, for good: two etcd requests
    in a row without a pause, the whole inventory read with each."""
    add_nodes(config, 1)
    watcher = TableWatcher(config)
    for index in range(5):
        store.put(f"status/n{index}.json", b"{}")
    store.compact(store.revision())
    assert watcher.wait_changed(timeout=0.2) is False  # compared: nothing new
    started = time.monotonic()
    assert watcher.wait_changed(timeout=0.3) is False
    assert time.monotonic() - started >= 0.25  # it waited for a change
    add_nodes(config, 2)
    assert watcher.wait_changed(timeout=5) is True and set(watcher.table.nodes) == {"n1", "n2"}
