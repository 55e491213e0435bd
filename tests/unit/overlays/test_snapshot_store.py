"""The inventory as overlays and the API read it outside a server's boot table
(take_snapshot, service.inventory.snapshot) follows the store, not inventory.yaml's stat in
the state dir: with etcd that file is not the inventory (absent, or left from before the
move to etcd), and a cache keyed on its stat served a stale inventory until a restart."""

from __future__ import annotations

import pytest

from provisiond.errors import NodeNotFound
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.overlays import ensure_overlay
from provisiond.service.inventory import snapshot
from provisiond.service.overlays import render_file
from provisiond.state.layout import Layout


def add(config, name: str, **fields) -> None:
    with InventoryStore(config).edit() as inv:
        inv.nodes[name] = Record(system_overlays=["hostname"], **fields)


@pytest.mark.parametrize("local_file", [False, True], ids=["no-file", "file-left"])
def test_overlays_follow_the_inventory_on_a_store_that_is_not_files(config, store,
                                                                    local_file):
    if local_file:
        Layout.of(config).inventory.write_text("nodes: {}\n")
    add(config, "n1")
    assert render_file(config, "n1", "hostname", "/etc/hostname") == b"n1\n"
    assert ensure_overlay(config, "n1", "system").is_file()
    add(config, "n2")
    assert render_file(config, "n2", "hostname", "/etc/hostname") == b"n2\n"
    assert ensure_overlay(config, "n2", "system").is_file()
    with InventoryStore(config).edit() as inv:
        del inv.nodes["n1"]
    with pytest.raises(NodeNotFound):
        render_file(config, "n1", "hostname", "/etc/hostname")


def test_the_apis_inventory_follows_the_store_with_a_file_left_in_the_state_dir(config,
                                                                                  store):
    Layout.of(config).inventory.write_text("nodes: {}\n")  # from before the move to etcd
    add(config, "n1")
    assert set(snapshot(config).inventory.nodes) == {"n1"}
    add(config, "n2")
    assert set(snapshot(config).inventory.nodes) == {"n1", "n2"}
    assert snapshot(config) is snapshot(config)  # unchanged: the same one, not made again
