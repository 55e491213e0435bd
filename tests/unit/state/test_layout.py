"""state.layout: one name per path, its store key, and the contracts doc made from them."""

import re
from pathlib import Path, PurePosixPath

import pytest

from provisiond.errors import InvalidInput
from provisiond.state.layout import (CACHE_ENV, ENTRIES, KEYS, Layout, doc_lines, lock_of,
                                     placeholders)

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("one", ENTRIES, ids=[e.pattern for e in ENTRIES])
def test_each_entry_is_the_key_its_method_gives(one):
    assert str(one.function(KEYS, *placeholders(one.function))) == one.pattern.rstrip("/")


def test_every_path_the_layout_names_is_an_entry():
    """A new method or property naming a path must be declared (and so documented)."""
    declared = {e.function for e in ENTRIES}
    helpers = {"of", "key", "path", "cache"}  # cache: the download root, maybe elsewhere
    for name, member in vars(Layout).items():
        if name in helpers or name.startswith("__"):
            continue
        function = member.fget if isinstance(member, property) else member
        assert function in declared, f"Layout.{name} names a path but is no @entry"


def test_keys_and_paths_turn_into_each_other(tmp_path):
    layout = Layout(tmp_path)
    assert layout.key(layout.status("n1")) == "status/n1.json" == str(KEYS.status("n1"))
    assert layout.path("status/n1.json") == layout.status("n1")
    assert layout.key(str(layout.blob("ab"))) == "blobs/sha256/ab"
    assert isinstance(KEYS.inventory, PurePosixPath)


@pytest.mark.parametrize("key", ["../etc/passwd", "/etc/passwd", "status/../../x", ""])
def test_a_key_outside_the_state_dir_is_refused(tmp_path, key):
    with pytest.raises(InvalidInput):
        Layout(tmp_path).path(key)


def test_a_path_outside_the_state_dir_has_no_key(tmp_path):
    with pytest.raises(InvalidInput, match="not under the state directory"):
        Layout(tmp_path / "state").key(tmp_path / "other" / "status" / "n1.json")


def test_downloads_go_to_the_shared_cache_when_one_is_set(config, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert Layout.of(config).debs == config.state_dir / "cache" / "debs"
    monkeypatch.setenv(CACHE_ENV, "/srv/cache")
    assert Layout.of(config).debs == Path("/srv/cache/debs")
    assert Layout.of(config).layers == config.state_dir / "cache" / "layers"  # not shared


def test_a_lock_is_its_document_with_a_lock_suffix():
    assert str(lock_of(KEYS.status("n1"))) == "status/n1.lock"


def test_the_path_properties_config_still_has_are_the_layouts(config):
    """Kept for modules not moved yet (provisiond.status, inventory, trust, images.squash):
    they must name what the layout names."""
    layout = Layout.of(config)
    assert config.inventory_path == layout.inventory
    assert config.secrets_path == layout.secrets
    assert config.status_dir == layout.status_dir
    assert config.trust_dir == layout.trust_dir
    assert config.blob_dir == layout.blobs
    assert config.images_dir == layout.images


def test_the_contracts_doc_lists_every_layout_path_and_no_other():
    """docs/contracts.md's state directory block is the layout's, line for line (a path
    added to either alone fails here)."""
    text = (REPO / "docs" / "contracts.md").read_text()
    section = text.split("## State directory (`Config.state_dir`)\n", 1)[1]
    block = section.split("```\n", 2)[1]
    assert block.splitlines() == doc_lines(), "run python -m provisiond.state.layout"


def test_the_doc_lines_name_each_pattern_once():
    patterns = [line.split()[0] for line in doc_lines() if not line.startswith(" ")]
    assert patterns == [e.pattern for e in ENTRIES]
    assert len(set(patterns)) == len(patterns)


# Modules not moved to the layout yet (others are changing them in this session): each
# should name its paths through Layout and leave this list.
NOT_MOVED: set[str] = set()  # every module now takes its paths from the layout
PATH_BUILDING = re.compile(r"state_dir\)?\s*/|state_dir\}/|(?<!KEYS)(?<!layout)\."
                           r"(inventory_path|secrets_path|blob_dir|images_dir|status_dir|"
                           r"trust_dir)\b")


def test_no_module_builds_a_state_path_of_its_own():
    """Paths under the state dir come from the layout (twelve modules built their own)."""
    found = set()
    for path in sorted((REPO / "provisiond").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in ("provisiond/state/layout.py", "provisiond/config.py"):
            continue
        if PATH_BUILDING.search(path.read_text()):
            found.add(rel)
    assert found <= NOT_MOVED, f"build paths of their own: {sorted(found - NOT_MOVED)}"
