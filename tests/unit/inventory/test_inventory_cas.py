"""The inventory written by compare-and-swap: a writer that loses to another applies its
change again to what the other wrote, as a lock would have had it wait."""

from __future__ import annotations

import threading

import pytest

from provisiond.errors import StaleRevision
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.inventory.store import RecordChanged
from provisiond.state import open as opening
from provisiond.state.files import FilesStore


def _edit_meanwhile(config, monkeypatch, other):
    """Run `other` (another writer) once, between this writer's read and its put."""
    store = opening.open_store(config)
    real_put = store.put
    done = []

    def put(key, value, expect=None):
        if key == "inventory.yaml" and not done:
            done.append(True)
            monkeypatch.setattr(store, "put", real_put)
            other()
        return real_put(key, value, expect)

    monkeypatch.setattr(store, "put", put)


def test_a_lost_race_keeps_both_writers_records(config, store, monkeypatch):
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="one")

    def other():
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n1"] = Record(comment="changed")
            inventory.nodes["n2"] = Record()

    _edit_meanwhile(config, monkeypatch, other)
    with InventoryStore(config).edit_records() as mine:
        mine.nodes["n3"] = Record(kernel_args=["quiet"])
    stored = InventoryStore(config).read()
    assert sorted(stored.nodes) == ["n1", "n2", "n3"]
    assert stored.nodes["n1"].comment == "changed"
    assert stored.revision == 3 and mine.revision == 3  # the caller's draft is what was written


def test_a_record_both_changed_is_decided_again(config, store, monkeypatch):
    """The caller decided from the record it read (an If-Match, the fields it kept): it is
    told, and the service layer runs its change again on the newer record."""
    from provisiond.service.records import write_records
    from provisiond.service.inventory import NODES

    _add(config, "n1", "one")

    def other():
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n1"] = Record(comment="one", tags={"x": "1"})

    _edit_meanwhile(config, monkeypatch, other)
    with pytest.raises(RecordChanged, match="node n1 was changed by another writer"):
        with InventoryStore(config).edit_records() as inventory:
            inventory.nodes["n1"] = Record(comment="two")
    _edit_meanwhile(config, monkeypatch, lambda: _add(config, "n1", "three"))
    calls = []

    def change(name, stored):
        calls.append(stored.comment)
        return stored.model_copy(update={"kernel_args": ["quiet"]})

    write_records(config, "cli:test", NODES, "set", ["n1"], change)
    assert calls == ["one", "three"]
    stored = InventoryStore(config).read().nodes["n1"]
    assert stored.comment == "three" and stored.kernel_args == ["quiet"]


def test_a_lost_race_with_a_named_revision_is_stale(config, store, monkeypatch):
    _edit_meanwhile(config, monkeypatch, lambda: _add(config, "n2"))
    with pytest.raises(StaleRevision):
        with InventoryStore(config).edit_records(expected_revision=0) as inventory:
            inventory.nodes["n1"] = Record()
    assert sorted(InventoryStore(config).read().nodes) == ["n2"]


def test_a_create_that_lost_to_another_create_is_refused(config, store, monkeypatch):
    _edit_meanwhile(config, monkeypatch, lambda: _add(config, "n1", "theirs"))
    with pytest.raises(RecordChanged, match="node n1 was changed by another writer"):
        _add(config, "n1", "mine")
    assert InventoryStore(config).read().nodes["n1"].comment == "theirs"


def _add(config, name, comment=None):
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes[name] = Record(comment=comment)


def add_at_once(config_of, count: int = 20, timeout: float = 120) -> list[Exception]:
    """`count` writers in threads, writer i adding node t<i> through InventoryStore(
    config_of(i)) (called in its thread); the errors they met. Also the etcd test's."""
    errors = []

    def write(index: int) -> None:
        try:
            with InventoryStore(config_of(index)).edit_records() as inventory:
                inventory.nodes[f"t{index}"] = Record(comment=str(index))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return errors


def test_concurrent_edits_through_two_stores_lose_none(config, monkeypatch):
    """20 writers in threads, half through each of two store objects on one state dir."""
    stores = [FilesStore(config.state_dir), FilesStore(config.state_dir)]
    turn = threading.local()
    monkeypatch.setattr(opening, "open_store", lambda config: stores[turn.index])

    def through(index: int):
        turn.index = index % 2  # this thread's writes go through stores[index % 2]
        return config

    errors = add_at_once(through)
    turn.index = 0
    assert not errors
    stored = InventoryStore(config).read()
    assert sorted(stored.nodes) == sorted(f"t{i}" for i in range(20))
    assert stored.revision == 20
