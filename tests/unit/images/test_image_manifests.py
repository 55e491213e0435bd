"""images.manifests: names, and images built before names were DNS labels."""

import json

import pytest

from provisiond.errors import InvalidInput
from provisiond.images.manifests import delete_image, load_manifest, manifest_path


def built(config, name: str) -> None:
    folder = config.images_dir / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": name, "layers": []}))


def test_an_image_built_under_an_older_name_rule_can_be_shown_and_deleted(config):
    """`debian_12` was a valid image name until names became DNS labels: its build must
    not become undeletable (its blobs would be kept by gc forever)."""
    built(config, "debian_12")
    assert load_manifest(config, "debian_12")["name"] == "debian_12"
    delete_image(config, "debian_12")
    assert not (config.images_dir / "debian_12").exists()


@pytest.mark.parametrize("name", ["debian_12", "../x", ".hidden", "a/b", ""])
def test_a_name_outside_the_rule_names_no_new_image(config, name):
    with pytest.raises(InvalidInput, match="not an image name"):
        manifest_path(config, name)
