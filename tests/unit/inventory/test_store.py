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


def test_the_inventory_carries_its_schema_and_a_newer_one_is_refused(config):
    with InventoryStore(config).edit() as inventory:
        inventory.nodes["n1"] = Record()
    assert config.inventory_path.read_text().splitlines()[1] == "schema: 1"
    text = config.inventory_path.read_text().replace("schema: 1", "schema: 2")
    config.inventory_path.write_text(text)
    with pytest.raises(InvalidInventory, match="written by a newer provisiond \\(inventory "
                       "schema 2; this one reads up to 1\\)"):
        InventoryStore(config).read()
    with pytest.raises(InvalidInventory):
        with InventoryStore(config).edit():
            pass
    assert config.inventory_path.read_text() == text


def test_an_older_inventory_is_migrated_on_its_next_write_with_a_backup(config, monkeypatch):
    """No older inventory format exists yet: a migration 1 -> 2 stands in for the first."""
    from provisiond.documents import Schema
    from provisiond.inventory import store

    with InventoryStore(config).edit() as inventory:
        inventory.nodes["n1"] = Record(comment="old")
    old = config.inventory_path.read_text()
    monkeypatch.setattr(store, "INVENTORY_SCHEMA", Schema("inventory", 2, {1: lambda data: {
        **data, "nodes": {n: {**r, "comment": "migrated"} for n, r in data["nodes"].items()}}}))
    assert InventoryStore(config).read().nodes["n1"].comment == "migrated"
    assert config.inventory_path.read_text() == old  # reading writes nothing
    with InventoryStore(config).edit() as inventory:
        inventory.nodes["n2"] = Record()
    assert (config.state_dir / "inventory.yaml.schema-1.bak").read_text() == old
    assert config.inventory_path.read_text().splitlines()[1] == "schema: 2"
    assert InventoryStore(config).read().nodes["n1"].comment == "migrated"
