"""The store: stable YAML, revisions, stale writes refused, failed edits write nothing."""

import pytest
import yaml

from provisiond.errors import InvalidInventory, StaleRevision
from provisiond.inventory import InventoryStore
from provisiond.inventory import text as text_module
from provisiond.inventory.store import HEADER, dump_yaml
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


def test_a_write_drops_hand_written_comments_and_the_file_says_so(config):
    """No comment-keeping YAML library is a dependency (PyYAML drops comments): the file's
    own first lines tell whoever edits it by hand, and point at the comment field."""
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record(image="tiny")
    text = config.inventory_path.read_text()
    config.inventory_path.write_text(text.replace("  n1:\n", "  # rack r1\n  n1:  # PSU\n")
                                     .replace("image: tiny", "image: tiny2"))
    with store.edit() as inventory:
        inventory.nodes["n2"] = Record(comment="rack r1")
    lines = config.inventory_path.read_text().splitlines()
    assert lines[:2] == HEADER.splitlines() and "comments are not kept" in HEADER
    assert not [line for line in lines[2:] if "#" in line]
    assert store.read().nodes["n1"].image == "tiny2"  # the hand edit itself is kept


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
    assert config.inventory_path.read_text().startswith(f"{HEADER}schema: 1\n")
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
    assert config.inventory_path.read_text().startswith(f"{HEADER}schema: 2\n")
    assert InventoryStore(config).read().nodes["n1"].comment == "migrated"


TRICKY = ["", " lead", "trail ", "yes", "no", "on", "null", "~", "010", "1_000", "12:30",
          "52:54:00:00:00:01", "a: b", "- x", "#c", "'q'", '"dq"', "a\nb\n", "a\nb",
          "line1\n  indented\n", "\u00fcn\u00efc\u00f6d\u00e9 \u2713 \u4e2d\u6587",
          "\u00a0nbsp", "x" * 150, " ".join(["word"] * 40), "back\\slash", "{a}", "[b]",
          "&anchor", "*alias", "!tag", "%pct", "@at", "`tick", "a,b", "?q", "|", ">", "0x1f",
          "1e3", ".inf", "True", "NULL", "emoji \U0001F600", "a  b", "end:", "\n", "x\n\n"]


class _PythonDumper(yaml.SafeDumper):
    pass


_PythonDumper.add_representer(str, text_module._str_presenter)


def tricky_inventory(texts=TRICKY) -> dict:
    nodes = {f"n{i}": {"comment": text, "tags": {"t": text, "x.y": text}}
             for i, text in enumerate(texts)}
    return {"revision": 3, "profiles": {"p": {"comment": texts[-1]}}, "nodes": nodes}


def test_libyaml_and_python_emitters_write_the_same_data():
    """dump_yaml uses libyaml's emitter (3x faster for 10,000 nodes); the data it writes is
    the Python emitter's, whatever the strings."""
    data = tricky_inventory()
    fast, slow = dump_yaml(data), dump_yaml(data, dumper=_PythonDumper)
    assert yaml.safe_load(fast) == yaml.safe_load(slow) == data


def test_tricky_strings_survive_a_write_and_a_read(config):
    store = InventoryStore(config)
    data = tricky_inventory([t for t in TRICKY if "\n" not in t])  # a record's are one line
    with store.edit() as inventory:
        for kind in ("profiles", "nodes"):
            for name, record in data[kind].items():
                getattr(inventory, kind)[name] = Record.model_validate(record)
    config.state_dir.joinpath(".inventory.cache.json").unlink()  # read the YAML itself
    assert store.read().to_data() | {"revision": 3} == data


def test_a_refused_edit_leaves_nothing_for_the_next_one(config):
    """The draft is the inventory read for this edit (no copy): a refused draft must not
    be what a later edit or read starts from."""
    store = InventoryStore(config)
    with store.edit() as inventory:
        inventory.nodes["n1"] = Record(comment="kept")
    with pytest.raises(InvalidInventory):
        with store.edit() as inventory:
            inventory.nodes["n1"].comment = "changed"
            inventory.nodes["n2"] = Record(profiles=["missing"])
    with store.edit() as inventory:
        assert inventory.nodes["n1"].comment == "kept" and "n2" not in inventory.nodes
        inventory.nodes["n3"] = Record()
    assert store.read().revision == 2 and sorted(store.read().nodes) == ["n1", "n3"]
