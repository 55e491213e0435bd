"""images.manifests: names, and images built before names were DNS labels."""

import json
from pathlib import Path

import pytest

from provisiond.errors import BuildFailed, InvalidInput
from provisiond.images.layers import cached_layer
from provisiond.images.manifests import (collect_garbage, delete_image, list_images,
                                         load_manifest, manifest_path, save_manifest)
from provisiond.state.layout import Layout
from provisiond.state.models import DamagedDocument


def built(config, name: str) -> None:
    path = Layout.of(config).image_manifest(name)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": name, "layers": []}))


def test_an_image_built_under_an_older_name_rule_can_be_shown_and_deleted(config):
    """`debian_12` was a valid image name until names became DNS labels: its build must
    not become undeletable (its blobs would be kept by gc forever)."""
    built(config, "debian_12")
    assert load_manifest(config, "debian_12")["name"] == "debian_12"
    delete_image(config, "debian_12")
    assert not Layout.of(config).image_manifest("debian_12").parent.exists()


@pytest.mark.parametrize("name", ["debian_12", "../x", ".hidden", "a/b", ""])
def test_a_name_outside_the_rule_names_no_new_image(config, name):
    with pytest.raises(InvalidInput, match="not an image name"):
        manifest_path(config, name)


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "state"


def test_a_damaged_manifest_is_one_clear_error_naming_its_file(config):
    """A manifest cut short (a full disk, a hand edit) was a JSONDecodeError traceback."""
    path = Layout.of(config).image_manifest("tiny")
    path.parent.mkdir(parents=True)
    path.write_text('{"name": "tiny", "kern')
    with pytest.raises(DamagedDocument, match=f"{path}: not JSON"):
        load_manifest(config, "tiny")
    path.write_text("[]")
    with pytest.raises(DamagedDocument, match="not a JSON object"):
        load_manifest(config, "tiny")
    assert list_images(config) == []


def test_a_saved_manifest_is_checked_and_written_as_the_builder_wrote_it(config):
    """The builder's manifest (a real one, mounted part included) is written byte for
    byte as before the model; one without a kernel is refused and writes nothing."""
    raw = (FIXTURES / "manifest-mounted.json").read_text()
    save_manifest(config, json.loads(raw))
    assert Layout.of(config).image_manifest("tiny").read_text() == raw
    broken = {**json.loads(raw), "name": "other"}
    del broken["kernel"]
    with pytest.raises(BuildFailed, match="image 'other': manifest: kernel: Field required"):
        save_manifest(config, broken)
    assert not Layout.of(config).image_manifest("other").exists()


def test_gc_drops_a_damaged_layer_record_and_the_cache_rebuilds_it(config):
    """A layer record cut short stopped every build and `image gc` with a traceback."""
    layout = Layout.of(config)
    layout.layer_tree("k1").mkdir(parents=True)
    layout.layer_record("k1").write_text('{"key": "k1", "dig')
    assert cached_layer(config, "k1") is None
    assert collect_garbage(config)["trees_removed"] == 1
    assert not layout.layer_tree("k1").exists() and not layout.layer_record("k1").exists()
