"""The file a write of a few records makes is, byte for byte, the dump of the whole
inventory (what every write made before writes dumped only their records)."""

from __future__ import annotations

import random

from provisiond.inventory import InventoryStore
from provisiond.inventory import store as store_module
from provisiond.inventory.model import Record, node_sort_key
from provisiond.inventory.store import HEADER, INVENTORY_SCHEMA, dump_yaml
from provisiond.inventory.text import Text, split_pieces

# Strings that make libyaml quote, fold, escape, use block scalars (`|`, `|-`, `|+`, `|2`)
# or end the document with `...`, alone and glued together (records refuse control
# characters and line breaks today; the pieces do not rely on it).
ATOMS = ["a", " ", "\n", "\n\n", ":", "#", "-", "'", '"', "é", "\U0001F600", "\t", "\u2028",
         "\u2029", "\x85", "|", ">", "...", "---", "yes", "1", "\ufeff", "{", "[", ",", "?",
         "&", "*", "!", "%", "@", "`", "\\", "\r", "~", "null", "x" * 60]


def whole_dump(data: dict) -> str:
    """What a write made of `data` before: the whole inventory dumped at once."""
    return HEADER + dump_yaml({"schema": INVENTORY_SCHEMA.current, "revision": data["revision"],
                               "profiles": dict(sorted(data["profiles"].items())),
                               "nodes": dict(sorted(data["nodes"].items(),
                                                    key=lambda item: node_sort_key(item[0])))})


def head(revision: int) -> str:
    return f"{HEADER}schema: {INVENTORY_SCHEMA.current}\nrevision: {revision}\n"


# What a record takes: no control character, no line break.
RECORD_ATOMS = [a for a in ATOMS if a.isprintable() and a != "\ufeff"]


def random_data(rng: random.Random, atoms: list[str] = ATOMS) -> dict:
    def text() -> str:
        return "".join(rng.choice(atoms) for _ in range(rng.randint(0, 8)))

    data: dict = {}
    if rng.random() < 0.7:
        data["comment"] = text()
    if rng.random() < 0.4:
        data["tags"] = {f"k{i}": text() for i in range(rng.randint(0, 3))}
    if rng.random() < 0.4:
        data["system_overlays"] = ["hostname"] * rng.randint(0, 2)
    return data


def test_pieces_make_the_whole_dump_and_are_read_back_from_it():
    """Random records: the text put together from pieces equals the whole dump; the pieces
    read back from that text make it again; after random changes (added, replaced,
    removed records) the changed pieces still make the whole dump of the new data."""
    rng = random.Random(5)
    for _ in range(1200):
        data = {"revision": 3,
                "profiles": {f"p{i}": random_data(rng) for i in range(rng.randint(0, 3))},
                "nodes": {f"n{i}": random_data(rng)
                          for i in rng.sample(range(30), rng.randint(0, 5))}}
        text = whole_dump(data)
        assert Text.of(data).yaml_text(head(3)) == text
        pieces = split_pieces(text, head(3), data)
        assert pieces is not None, text
        read_back = Text.of(data, pieces)
        assert read_back.yaml_text(head(3)) == text
        changes: dict = {"profiles": {}, "nodes": {}}
        for _ in range(rng.randint(1, 3)):
            section = rng.choice(["profiles", "nodes"])
            name = f"{section[0]}{rng.randint(0, 30)}"
            changes[section][name] = None if rng.random() < 0.3 else random_data(rng)
        for section, records in changes.items():
            for name, record in records.items():
                if record is None:
                    data[section].pop(name, None)
                else:
                    data[section][name] = record
        assert read_back.changed(changes).yaml_text(head(3)) == whole_dump(data)


def test_a_file_in_another_layout_is_not_read_as_pieces():
    data = {"revision": 1, "profiles": {}, "nodes": {"n1": {"comment": "a"}, "n2": {}}}
    text = whole_dump(data)
    assert split_pieces(text, head(1), data) is not None
    assert split_pieces(text.replace("  n1:", "  n3:"), head(1), data) is None
    assert split_pieces(text.replace("  n2: {}\n", ""), head(1), data) is None
    assert split_pieces("nodes:\n  n1: {comment: a}\n", head(1), data) is None


def test_a_hand_edited_file_is_dumped_whole_on_the_next_write(config):
    """Only a file whose JSON cache says this module wrote it (same sha256) is read back
    as pieces: after a hand edit (a comment, flow style: the same data), the next write
    of one record writes the whole dump."""
    with InventoryStore(config).edit() as inventory:
        inventory.nodes["n1"] = Record(comment="a")
        inventory.nodes["n2"] = Record(comment="b")
    text = config.inventory_path.read_text()
    config.inventory_path.write_text(text.replace("  n2:\n    comment: b\n",
                                                  "  n2: {comment: b}  # by hand\n"))
    with InventoryStore(config).edit_records() as inventory:
        inventory.nodes["n1"] = Record(comment="c")
    written = config.inventory_path.read_text()
    assert "by hand" not in written
    assert written == whole_dump(InventoryStore(config).read().to_data())


def test_store_writes_are_the_whole_dump(config):
    """Through the store: writes of one record into an inventory of tricky records, by
    this process and by a fresh one (which reads the pieces back from the file), leave
    the bytes the whole dump gives."""
    rng = random.Random(9)
    with InventoryStore(config).edit() as inventory:
        for i in range(40):
            inventory.nodes[f"n{i}"] = Record.model_validate(random_data(rng, RECORD_ATOMS))
        inventory.profiles["p"] = Record.model_validate(random_data(rng, RECORD_ATOMS))
    for round_ in range(30):
        if round_ % 3 == 0:
            store_module._versions.clear()  # as a new process: pieces read from the file
        with InventoryStore(config).edit_records() as inventory:
            name = f"n{rng.randint(0, 45)}"
            if name in inventory.nodes and rng.random() < 0.2:
                del inventory.nodes[name]
            else:
                inventory.nodes[name] = Record.model_validate(random_data(rng, RECORD_ATOMS))
        written = config.inventory_path.read_text()
        data = InventoryStore(config).read().to_data()
        assert written == whole_dump(data)
