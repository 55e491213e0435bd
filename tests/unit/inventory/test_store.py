"""The store: stable YAML, revisions, stale writes refused, failed edits write nothing."""

import pytest

from provisiond.errors import InvalidInventory, StaleRevision
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record


def test_edit_bumps_revision_and_writes_sorted_yaml(config):
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n10"] = Record(image="tiny")
        inventory.nodes["n2"] = Record(image="tiny")
    text = config.inventory_path.read_text()
    assert text.index("n2:") < text.index("n10:")
    assert store.read().revision == 1


def test_unchanged_edit_keeps_revision_and_file(config):
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record(image="tiny")
    before = config.inventory_path.read_bytes()
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record(image="tiny")
    assert config.inventory_path.read_bytes() == before
    assert store.read().revision == 1


def test_stale_revision_is_refused(config):
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record()
    with pytest.raises(StaleRevision, match="revision is 1, not 0"):
        with store.edit(expected_revision=0) as inventory:
            inventory.nodes["n2"] = Record()
    assert "n2" not in store.read().nodes


def test_invalid_edit_writes_nothing(config):
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record()
    before = config.inventory_path.read_bytes()
    with pytest.raises(InvalidInventory):
        with store.edit() as inventory:
            inventory.nodes["n2"] = Record(profiles=["missing"])
    assert config.inventory_path.read_bytes() == before


def test_malformed_file_names_the_record(config):
    config.inventory_path.write_text("nodes:\n  n1:\n    netdevs:\n      eth0: {mac: bogus}\n")
    with pytest.raises(InvalidInventory, match="node n1: netdevs.eth0.mac: invalid MAC"):
        InventoryStore(config).read()


def test_json_cache_follows_the_yaml(config):
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record(image="tiny")
    cache = config.state_dir / ".inventory.cache.json"
    assert cache.exists()
    text = config.inventory_path.read_text().replace("image: tiny", "image: other")
    config.inventory_path.write_text(text)  # a hand edit: the cache no longer matches
    assert store.read().nodes["n1"].image == "other"
    cache.write_text("{not json")
    assert store.read().nodes["n1"].image == "other"
