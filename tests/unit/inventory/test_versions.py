"""What a process keeps of the inventory between writes never hides another writer's change,
and a writer waits for the lock without stopping a gevent worker."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from provisiond.atomic import locked
from provisiond.errors import InvalidInventory, Unavailable
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from tests.unit.inventory.test_text import whole_dump


def _names(config) -> list[str]:
    return sorted(InventoryStore(config).read().nodes)


def test_a_write_by_another_process_is_never_lost(state_dir, config):
    """This process writes (and keeps that version), the CLI in another process adds a
    node, this process writes again from what the file holds then: both changes stay."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="here")
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir))
    subprocess.run([sys.executable, "-m", "provisiond", "node", "add", "n2"], env=env,
                   check=True, capture_output=True, timeout=120)
    with InventoryStore(config).edit_records() as inventory:
        assert "n2" in inventory.nodes
        inventory.nodes["n3"] = Record(comment="here again")
    assert _names(config) == ["n1", "n2", "n3"]
    assert InventoryStore(config).read().revision == 3
    assert config.inventory_path.read_text() == whole_dump(
        InventoryStore(config).read().to_data())


def test_a_change_keeping_size_mtime_and_inode_is_seen(config):
    """The kept version is keyed by the file's content, not its stat: an edit in place of
    the same length, its mtime put back, is still read."""
    store = InventoryStore(config)
    with store.edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="aaaa")
    st = os.stat(config.inventory_path)
    text = config.inventory_path.read_text()
    with open(config.inventory_path, "r+") as handle:  # same inode, same size
        handle.write(text.replace("comment: aaaa", "comment: bbbb"))
    os.utime(config.inventory_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(config.inventory_path).st_mtime_ns == st.st_mtime_ns
    assert store.read().nodes["n1"].comment == "bbbb"
    with store.edit_records() as inventory:
        assert inventory.nodes["n1"].comment == "bbbb"


def test_claims_of_another_server_address_are_not_used(config):
    """A node on loopback is fine for a server on loopback; the same inventory served from
    another address refuses every write until it is fixed, as the whole check does."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "127.0.0.5"}}})
    config.server.address = "10.0.0.200"
    with pytest.raises(InvalidInventory, match="127.0.0.5 is loopback"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n2"] = Record(comment="unrelated")


def test_a_refused_write_leaves_the_kept_version_as_it_was(config):
    store = InventoryStore(config)
    with store.edit_records() as inventory:
        inventory.nodes["n1"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "10.0.0.1"}}})
        inventory.nodes["n2"] = Record(comment="kept")
    with pytest.raises(InvalidInventory):
        with store.edit_records() as inventory:
            inventory.nodes["n2"] = Record(comment="lost")
            inventory.nodes["n3"] = Record.model_validate({"netdevs": {"eth0": {
                "ipaddr": "10.0.0.1"}}})
    assert store.current().inventory.nodes["n2"].comment == "kept"
    assert "n3" not in store.current().inventory.nodes
    with store.edit_records() as inventory:
        inventory.nodes["n4"] = Record()
    assert _names(config) == ["n1", "n2", "n4"]
    assert InventoryStore(config).read().nodes["n2"].comment == "kept"


def test_a_write_gives_up_when_others_keep_winning(config, monkeypatch):
    """Another writer wins every compare-and-swap: the store retries, bounded, then says
    so, and writes nothing."""
    from provisiond.state import open as opening
    from tests.memstore import MemoryStore

    class Busy(MemoryStore):
        def put(self, key, value, expect=None):
            super().put(key, b"revision: 0\n")  # another writer, always just before
            return super().put(key, value, expect)

    monkeypatch.setattr(opening, "open_store", lambda config: Busy())
    with pytest.raises(Unavailable, match="written by others"):
        with InventoryStore(config, lock_wait=0.3).edit_records() as inventory:
            inventory.nodes["n1"] = Record()


def test_the_lock_is_waited_for_by_sleeping(tmp_path, monkeypatch):
    """The wait polls with time.sleep (gevent's, in a worker), and ends once released."""
    path = tmp_path / "x.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    sleeps: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 5:
            os.close(fd)  # the other writer is done
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    with locked(path, wait=10):
        pass
    assert len(sleeps) >= 5


GEVENT_WAITER = """
from gevent import monkey
monkey.patch_all()
import fcntl, os, sys, time
import gevent
from provisiond.atomic import locked

path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)        # a write in progress, in this same worker
ticks = []
def other_requests():
    for _ in range(20):
        ticks.append(time.monotonic())
        gevent.sleep(0.01)
def writer():
    with locked(path, wait=10):
        print("locked after", len(ticks), "ticks", flush=True)
def finish_the_write():
    gevent.sleep(0.3)
    os.close(fd)
gevent.joinall([gevent.spawn(other_requests), gevent.spawn(writer),
                gevent.spawn(finish_the_write)], timeout=20)
"""


def test_a_gevent_worker_keeps_serving_while_a_write_waits(tmp_path):
    """In one gevent worker, a write waiting for the lock another greenlet holds: the
    other greenlets run (a blocking flock would stop the worker, the holder included)."""
    done = subprocess.run([sys.executable, "-c", GEVENT_WAITER, str(tmp_path / "x.lock")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ticks = int(done.stdout.split()[2])
    assert ticks >= 10, done.stdout


def test_writers_in_threads_of_one_process_lose_nothing(config):
    """Threads of one process share the kept version: each write starts from the last."""
    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            with InventoryStore(config).edit_records() as inventory:
                inventory.nodes[name] = Record(comment=name)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert _names(config) == sorted(f"t{i}" for i in range(8))
    assert InventoryStore(config).read().revision == 8


def _as_another_process(config, change) -> None:
    """Write `change` as another process would: this one keeps the version it had."""
    from provisiond.inventory import store as store_module

    key = str(config.inventory_path)
    kept = store_module._versions[key]
    with InventoryStore(config).edit_records() as inventory:
        change(inventory)
    store_module._versions[key] = kept


def test_claims_carry_over_a_write_by_another_process(config, monkeypatch):
    """After another process's write, this one checks the next write against the claims
    of its own last version with the nodes that differ checked again (never the whole
    inventory): the other process's new address is taken, its freed one is free."""
    from provisiond.inventory import store as store_module

    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "10.0.0.1"}}})
    _as_another_process(config, lambda inventory: inventory.nodes.update(
        n1=Record.model_validate({"netdevs": {"eth0": {"ipaddr": "10.0.0.9"}}}),
        n2=Record.model_validate({"netdevs": {"eth0": {"ipaddr": "10.0.0.2"}}})))

    def whole(*_args, **_kwargs):
        raise AssertionError("the whole inventory was checked")

    monkeypatch.setattr(store_module, "check_inventory", whole)
    with pytest.raises(InvalidInventory, match="10.0.0.2 is already used by node n2"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n3"] = Record.model_validate({"netdevs": {"eth0": {
                "ipaddr": "10.0.0.2"}}})
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n3"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "10.0.0.1"}}})
    nodes = InventoryStore(config).read().nodes
    assert {n: r.netdevs["eth0"].ipaddr for n, r in nodes.items()} == {
        "n1": "10.0.0.9", "n2": "10.0.0.2", "n3": "10.0.0.1"}


def test_an_invalid_version_from_elsewhere_is_refused_as_a_whole(config):
    """Another writer (by hand) left two nodes on one address: no claims carry over, and
    the whole check refuses the next write."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record.model_validate({"netdevs": {"eth0": {
            "ipaddr": "10.0.0.1"}}})
    InventoryStore(config).read()
    text = config.inventory_path.read_text()
    config.inventory_path.write_text(text + "  n2:\n    netdevs:\n      eth0:\n"
                                            "        ipaddr: 10.0.0.1\n")
    with pytest.raises(InvalidInventory, match="node n2: netdevs.eth0.ipaddr: 10.0.0.1 is"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n3"] = Record()


def test_records_changed_elsewhere_are_read_anew(config):
    """Records equal to the kept version's are reused, the others are the file's."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="one")
        inventory.nodes["n2"] = Record(comment="two")
    before = InventoryStore(config).current().inventory
    _as_another_process(config, lambda inventory: inventory.nodes.update(
        n2=Record(comment="changed"), n3=Record(comment="new")))
    after = InventoryStore(config).current().inventory
    assert after.nodes["n1"] is before.nodes["n1"]
    assert {n: r.comment for n, r in after.nodes.items()} == {
        "n1": "one", "n2": "changed", "n3": "new"}
    assert after.revision == 2


def test_a_profile_changed_elsewhere_carries_no_claims_over(config):
    """A profile edited by hand gives its two users one MAC: the nodes' own records did
    not change, yet the next write is refused (the whole inventory is checked)."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.profiles["p"] = Record()
        inventory.nodes["n1"] = Record(profiles=["p"])
        inventory.nodes["n2"] = Record(profiles=["p"])
    InventoryStore(config).read()
    text = config.inventory_path.read_text()
    assert "  p: {}\n" in text
    config.inventory_path.write_text(text.replace(
        "  p: {}\n", "  p:\n    netdevs:\n      eth0:\n        mac: '52:54:00:00:00:09'\n"))
    with pytest.raises(InvalidInventory, match="52:54:00:00:00:09 is already used"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n3"] = Record()


def test_the_boot_table_merges_again_only_what_changed(config):
    """serve's table after a change: the unchanged nodes' merged records are the previous
    table's, the changed one is merged anew; a profile change merges every node."""
    from provisiond.boot.table import build_table

    with InventoryStore(config).edit_records() as inventory:
        inventory.profiles["p"] = Record(comment="p1")
        for name in ("n1", "n2"):
            inventory.nodes[name] = Record(profiles=["p"])
    first = build_table(config)
    _as_another_process(config, lambda inventory: inventory.nodes.update(
        n2=Record(profiles=["p"], image="other")))
    second = build_table(config, first)
    assert second.nodes["n1"] is first.nodes["n1"]
    assert second.nodes["n2"].record.image == "other"
    with InventoryStore(config).edit_records() as inventory:  # this process: claims known
        inventory.profiles["p"] = Record(comment="p2")
    third = build_table(config, second)
    assert {n.record.comment for n in third.nodes.values()} == {"p2"}


def _read_afresh(config):
    """The version as a process that kept nothing reads it (the JSON cache or the YAML)."""
    from provisiond.inventory import store as store_module

    kept = dict(store_module._versions)
    store_module._versions.clear()
    try:
        return InventoryStore(config).current()
    finally:
        store_module._versions.clear()
        store_module._versions.update(kept)


def test_a_version_read_as_changes_is_the_version_read_whole(config):
    """After another process's write, this one reads only the records whose lines changed:
    the data, records and text it gets are what a whole read gives."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.profiles["p"] = Record(comment="p")
        for i in range(1, 6):
            inventory.nodes[f"n{i}"] = Record(profiles=["p"], comment=f"c{i}")
    _as_another_process(config, lambda inventory: (
        inventory.nodes.update(n2=Record(comment="changed"), n10=Record(image="new")),
        inventory.nodes.pop("n4"), inventory.profiles.update(q=Record())))
    kept_before = InventoryStore(config).current().previous
    version = InventoryStore(config).current()
    whole = _read_afresh(config)
    assert version.text is not None and version.previous is kept_before  # read as changes
    assert version.data == whole.data
    assert version.inventory.to_data() == whole.inventory.to_data()
    assert version.text.yaml_text(store_module_head(version.revision)) == \
        config.inventory_path.read_text()
    assert version.inventory.nodes["n1"] is kept_before.inventory.nodes["n1"]


def store_module_head(revision: int) -> str:
    from provisiond.inventory.store import _head

    return _head(revision)


@pytest.mark.parametrize("old, new", [
    ("comment: a", "comment: 'b'"),  # spelled otherwise than a dump would
    ("      k: v\n", "      k: v\n    image: null\n"),  # dumped so, but no record's data
])
def test_a_hand_edit_is_read_whole(config, old, new):
    """Lines not in the form a write gives are not taken as pieces: the file is read whole,
    and its records are what it says."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="a")
        inventory.nodes["n2"] = Record(tags={"k": "v"})
    text = config.inventory_path.read_text()
    config.inventory_path.write_text(text.replace(old, new))
    version = InventoryStore(config).current()
    assert version.canonical is False
    assert version.data == _read_afresh(config).data
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n3"] = Record()
    assert config.inventory_path.read_text() == whole_dump(InventoryStore(config).read().to_data())


def test_anchors_written_by_hand_are_read_as_a_fresh_process_reads_them(config):
    """Each changed record's lines are parsed alone, so an anchor they share with another
    record's (YAML refuses an anchor defined twice in one file) was not seen: this process
    took a file every other process refuses, and kept it so in its next writes. A write
    never makes anchors, so lines with one are not a write's: the file is read whole."""
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="one")
        inventory.nodes["n2"] = Record(comment="two")
    InventoryStore(config).read()
    shared = "    nomad:\n      meta: &id001\n        a: b\n    ansible:\n      extra_vars: *id001\n"
    text = config.inventory_path.read_text()
    for name in ("one", "two"):
        text = text.replace(f"    comment: {name}\n", f"    comment: {name}\n{shared}")
    config.inventory_path.write_text(text)
    with pytest.raises(InvalidInventory, match="duplicate anchor"):
        _read_afresh(config)
    with pytest.raises(InvalidInventory, match="duplicate anchor"):
        InventoryStore(config).current()
