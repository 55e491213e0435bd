"""images.manifests: names, and images built before names were DNS labels."""

import json

import pytest

from provisiond.errors import ImageNotFound, InvalidInput
from provisiond.images.manifests import delete_image, load_manifest, manifest_key


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
        manifest_key(config, name)


def test_a_server_sharing_the_store_sees_an_image_built_elsewhere(tmp_path, monkeypatch):
    """The builder publishes a manifest through the store; a server with a state dir of its
    own (no manifest file, no blobs) lists it, loads it, and its boot cache follows a
    rebuild."""
    from provisiond.boot.artifacts import ManifestCache
    from provisiond.config import load_config, write_default_config
    from provisiond.images.manifests import list_images, save_manifest
    from provisiond.state.files import FilesStore

    shared = FilesStore(tmp_path / "shared")
    monkeypatch.setattr("provisiond.state.open.open_store", lambda config: shared)
    builder, server = (load_config(write_default_config(tmp_path / n).parent)
                       for n in ("builder", "server"))
    save_manifest(builder, {"name": "tiny", "layers": [], "build_seconds": 1})
    cache = ManifestCache(server, interval=0)
    assert load_manifest(server, "tiny")["build_seconds"] == 1
    assert [m["name"] for m in list_images(server)] == ["tiny"]
    assert cache.get("tiny")["build_seconds"] == 1
    save_manifest(builder, {"name": "tiny", "layers": [], "build_seconds": 2})
    assert cache.get("tiny")["build_seconds"] == 2
    assert not (server.images_dir / "tiny").exists()
    delete_image(builder, "tiny")
    with pytest.raises(ImageNotFound):
        cache.get("tiny")
