"""Recipe validation: one clear line naming the recipe and the layer; parents expand."""

from __future__ import annotations

import pytest
import yaml

from provisiond.config import load_config
from provisiond.images.build import plan_layers
from provisiond.images.recipe import RecipeError, RecipeNotFound, load_recipe


@pytest.fixture
def recipes(state_dir, tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (state_dir / "provisiond.yaml").write_text(yaml.safe_dump({"image_dirs": [str(folder)]}))
    return folder


def write(folder, name, data):
    (folder / name).mkdir(exist_ok=True)
    (folder / name / "image.yaml").write_text(yaml.safe_dump(data))


def error_of(state_dir, name) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(load_config(state_dir), name)
    return str(info.value)


def test_unknown_kind_names_recipe_layer_and_known_kinds(state_dir, recipes):
    write(recipes, "x", {"layers": [{"kind": "busybox"}, {"kind": "nope"}]})
    message = error_of(state_dir, "x")
    assert message.startswith("recipe x: layer 2: unknown kind 'nope' (known: busybox, copy")


def test_bad_field_names_the_layer(state_dir, recipes):
    write(recipes, "x", {"layers": [{"kind": "busybox", "modules": 3}]})
    assert error_of(state_dir, "x").startswith("recipe x: layer 1 (busybox): modules")


def test_extra_field_is_refused(state_dir, recipes):
    write(recipes, "x", {"layers": [{"kind": "debootstrap", "suit": "bookworm"}]})
    assert "layer 1 (debootstrap): suit: Extra inputs are not permitted" in error_of(
        state_dir, "x")


def test_base_must_come_first_and_only_first(state_dir, recipes):
    write(recipes, "x", {"layers": [{"kind": "run", "commands": ["true"]}]})
    assert "layer 1 (run): the first layer must be a base" in error_of(state_dir, "x")
    write(recipes, "y", {"layers": [{"kind": "busybox"}, {"kind": "busybox"}]})
    assert "layer 2 (busybox): a base kind can only be the first layer" in error_of(
        state_dir, "y")


def test_parent_loop_is_reported(state_dir, recipes):
    write(recipes, "a", {"layers": [{"kind": "image", "name": "b"}]})
    write(recipes, "b", {"layers": [{"kind": "image", "name": "a"}]})
    assert "parent images form a loop" in error_of(state_dir, "a")


def test_missing_recipe_and_bad_yaml(state_dir, recipes):
    with pytest.raises(RecipeNotFound):
        load_recipe(load_config(state_dir), "absent")
    (recipes / "broken").mkdir()
    (recipes / "broken/image.yaml").write_text("layers: [\n")
    assert "recipe broken" in error_of(state_dir, "broken") and "not valid YAML" in error_of(
        state_dir, "broken")


def test_child_inherits_parent_layers_init_and_args(config):
    parent = load_recipe(config, "debian12")
    child = load_recipe(config, "debian12-compute")
    assert [s.kind for s in child.steps] == [s.kind for s in parent.steps] + ["packages", "run",
                                                                       "copy"]
    assert child.init == "/lib/systemd/systemd" == parent.init
    assert child.kernel_args == parent.kernel_args


def test_keys_chain_parent_and_ignore_descriptions(state_dir, recipes, monkeypatch):
    from provisiond.images import steps

    monkeypatch.setattr(steps, "apt_mirror", lambda: "http://mirror.invalid/debian")
    base = {"kind": "debootstrap", "description": "one"}
    write(recipes, "x", {"layers": [base, {"kind": "run", "commands": ["true"]}]})
    config = load_config(state_dir)
    first = [p.key for p in plan_layers(config, load_recipe(config, "x"), "zstd")]
    write(recipes, "x", {"layers": [{**base, "description": "two"},
                                    {"kind": "run", "commands": ["false"]}]})
    second = [p.key for p in plan_layers(config, load_recipe(config, "x"), "zstd")]
    assert first[0] == second[0] and first[1] != second[1]
    gzip = [p.key for p in plan_layers(config, load_recipe(config, "x"), "gzip")]
    assert gzip[0] != second[0]


def _keys(state_dir, name) -> list[str]:
    config = load_config(state_dir)
    return [p.key for p in plan_layers(config, load_recipe(config, name), "zstd")]


def test_copied_file_mode_is_in_the_key(state_dir, recipes):
    """A copy without `mode:` keeps the source's mode, so a chmod must rebuild the layer."""
    write(recipes, "c", {"layers": [{"kind": "directory", "path": "tree"},
                                    {"kind": "copy", "files": [{"src": "tool", "dest": "/t"}]}]})
    (recipes / "c" / "tree").mkdir()
    (recipes / "c" / "tool").write_text("#!/bin/sh\n")
    (recipes / "c" / "tool").chmod(0o644)
    before = _keys(state_dir, "c")
    (recipes / "c" / "tool").chmod(0o755)
    after = _keys(state_dir, "c")
    assert before[0] == after[0] and before[1] != after[1]


def test_directory_key_follows_a_symlink_target_not_its_content(state_dir, recipes):
    write(recipes, "d", {"layers": [{"kind": "directory", "path": "tree"}]})
    tree = recipes / "d" / "tree"
    tree.mkdir()
    for name in ("a", "b"):
        (tree / name).write_text("same\n")
    (tree / "link").symlink_to("a")
    before = _keys(state_dir, "d")
    (tree / "link").unlink()
    (tree / "link").symlink_to("b")
    assert _keys(state_dir, "d") != before
