"""images.manifests: names, and images built before names were DNS labels."""

import json
import os
import threading
from pathlib import Path

import pytest

from provisiond.atomic import locked
from provisiond.config import load_config, write_default_config
from provisiond.errors import BuildFailed, ImageNotFound, InvalidInput
from provisiond.images.layers import cached_layer, claim_session, shell_mounting
from provisiond.images.manifests import (collect_garbage, delete_image, image_generation,
                                         list_images, load_manifest, manifest_key,
                                         save_manifest)
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
        manifest_key(config, name)


def test_a_server_sharing_the_store_sees_an_image_built_elsewhere(tmp_path, monkeypatch):
    """The builder publishes a manifest through the store; a server with a state dir of its
    own (no manifest file, no blobs) lists it, loads it, and its boot cache follows a
    rebuild."""
    from provisiond.boot.artifacts import ManifestCache
    from provisiond.config import load_config, write_default_config
    from provisiond.state.files import FilesStore

    shared = FilesStore(tmp_path / "shared")
    monkeypatch.setattr("provisiond.state.open.open_store", lambda config: shared)
    builder, server = (load_config(write_default_config(tmp_path / n).parent)
                       for n in ("builder", "server"))
    manifest = json.loads((FIXTURES / "manifest-mounted.json").read_text())
    save_manifest(builder, {**manifest, "build_seconds": 1})
    cache = ManifestCache(server, interval=0)
    assert load_manifest(server, "tiny")["build_seconds"] == 1
    assert [m["name"] for m in list_images(server)] == ["tiny"]
    assert cache.get("tiny")["build_seconds"] == 1
    save_manifest(builder, {**manifest, "build_seconds": 2})
    assert cache.get("tiny")["build_seconds"] == 2
    assert not (server.images_dir / "tiny").exists()
    delete_image(builder, "tiny")
    with pytest.raises(ImageNotFound):
        cache.get("tiny")


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "state"


def test_a_damaged_manifest_is_one_clear_error_naming_its_file(config):
    """A manifest cut short (a full disk, a hand edit) was a JSONDecodeError traceback."""
    path = Layout.of(config).image_manifest("tiny")
    path.parent.mkdir(parents=True)
    path.write_text('{"name": "tiny", "kern')
    with pytest.raises(DamagedDocument, match="images/tiny/manifest.json: not JSON"):
        load_manifest(config, "tiny")
    path.write_text("[]")
    with pytest.raises(DamagedDocument, match="not a JSON object"):
        load_manifest(config, "tiny")
    assert list_images(config) == []


def test_the_generation_of_an_image_none_when_it_is_not_built(config):
    """What `image shell` compares at its exit: None (deleted), "" (a manifest built before
    generations, or damaged: not the one a session opened on a whole one), or the value."""
    assert image_generation(config, "tiny") is None
    manifest = json.loads((FIXTURES / "manifest-mounted.json").read_text())
    save_manifest(config, manifest)
    assert image_generation(config, "tiny") == ""
    save_manifest(config, {**manifest, "generation": "0123456789abcdef"})
    assert image_generation(config, "tiny") == "0123456789abcdef"
    Layout.of(config).image_manifest("tiny").write_text('{"name": "tiny", "gen')
    assert image_generation(config, "tiny") == ""


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


def test_gc_keeps_the_blobs_of_a_manifest_of_another_shape(config):
    """A manifest without a kernel (trimmed, edited by hand) stopped `image gc` with a
    KeyError traceback; its layers' blobs are kept, the others go."""
    blobs = Layout.of(config).blobs
    blobs.mkdir(parents=True)
    kept, dropped = "a" * 64, "b" * 64
    for name in (kept, dropped):
        (blobs / name).write_bytes(b"x")
    path = Layout.of(config).image_manifest("old")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "old", "layers": [{"digest": f"sha256:{kept}"}],
                                "mounted": {"kit": None}}))
    assert collect_garbage(config)["blobs_removed"] == 1
    assert sorted(p.name for p in blobs.iterdir()) == [kept]


def test_gc_leaves_a_blob_being_fetched_from_a_peer(config):
    """A peer fetch (no gc lock, unlike a build) writes a temp file in the blob store: gc
    deleted it under the fetch, which then failed; a crash's old temp file still goes."""
    import os
    import time

    blobs = Layout.of(config).blobs
    blobs.mkdir(parents=True)
    (blobs / ".incoming.new").write_bytes(b"x")
    (blobs / ".incoming.old").write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(blobs / ".incoming.old", (two_hours_ago, two_hours_ago))
    assert collect_garbage(config)["blobs_removed"] == 1
    assert [p.name for p in blobs.iterdir()] == [".incoming.new"]


def test_gc_keeps_the_layer_trees_an_image_shell_session_mounts(config):
    """`image gc` waited, silently, as long as an interactive `image shell` was open (the
    session held the gc lock to keep its layer trees). gc runs now and keeps the trees a
    session's `lowers` file names (its image deleted meanwhile, say); the others go."""
    layout = Layout.of(config)
    for key in ("mounted", "unused"):
        layout.layer_tree(key).mkdir(parents=True)
        layout.layer_record(key).write_text(json.dumps({"key": key, "digest": "sha256:aa"}))
    session = layout.shell_session("img", "k3x9")
    session.mkdir()
    (session / "lowers").write_text("mounted\n")
    assert collect_garbage(config)["trees_removed"] == 1
    assert layout.layer_tree("mounted").is_dir() and layout.layer_record("mounted").exists()
    assert not layout.layer_tree("unused").exists()


def shell_tarballs(config, name: str, listed: list[str], kept: list[str]) -> dict:
    """An image's `image shell` folder: tarballs shell.json lists, and others (sessions
    whose layer could not be added); their paths by name."""
    layout = Layout.of(config)
    folder = layout.image_shell_dir(name)
    folder.mkdir(parents=True)
    for tar in (*listed, *kept):
        (folder / tar).write_bytes(tar.encode() * 100)
    layout.image_shell_layers(name).write_text(json.dumps(
        [{"path": f"shell/{tar}", "description": "image shell: x"} for tar in listed]))
    return {tar: folder / tar for tar in (*listed, *kept)}


def test_gc_shows_the_shell_tarballs_no_image_lists_and_removes_them_only_when_asked(
        config):
    """A session whose layer could not be added (rebuild failed, image replaced) keeps its
    tarball in images/NAME/shell/, listed nowhere: `image gc` said nothing of them, and
    they piled up unseen. gc lists them now (path, size, modified) and keeps them, an
    admin's work; asked to, it removes those and only those."""
    built(config, "one")
    paths = shell_tarballs(config, "one", ["a.tar"], ["b.tar", "c.tar"])
    paths |= shell_tarballs(config, "two", [], ["d.tar"])
    result = collect_garbage(config)
    assert [(t["image"], t["path"], t["size"]) for t in result["shell_tarballs_kept"]] == [
        ("one", str(paths["b.tar"]), 500), ("one", str(paths["c.tar"]), 500),
        ("two", str(paths["d.tar"]), 500)]
    assert result["shell_tarballs_removed"] == []
    assert all(path.is_file() for path in paths.values())
    result = collect_garbage(config, shell_tarballs=True)
    assert [t["path"] for t in result["shell_tarballs_removed"]] == [
        str(paths[t]) for t in ("b.tar", "c.tar", "d.tar")]
    assert result["shell_tarballs_kept"] == []
    assert sorted(p.name for p in paths["a.tar"].parent.iterdir()) == ["a.tar"]
    assert not paths["d.tar"].exists()


def test_gc_leaves_the_shell_tarballs_of_an_image_whose_listing_is_damaged(config):
    """Which of them its shell.json lists is not known: none is shown or removed, and gc
    goes on (no traceback), saying so (it said nothing: the tarballs stayed unseen)."""
    paths = shell_tarballs(config, "bad", ["a.tar"], ["b.tar"])
    Layout.of(config).image_shell_layers("bad").write_text('[{"pa')
    result = collect_garbage(config, shell_tarballs=True)
    assert result["shell_tarballs_removed"] == result["shell_tarballs_kept"] == []
    assert all(path.is_file() for path in paths.values())
    [unreadable] = result["shell_listings_unreadable"]
    assert unreadable["image"] == "bad" and "shell.json is unreadable" in unreadable["error"]


def test_gc_never_takes_a_listed_tarball_when_the_state_dir_is_named_through_dotdot(
        tmp_path):
    """`--state-dir ../state` is made absolute, not normalized: the listed paths were
    normalized and the found ones not, so no listed tarball matched, and --shell-tarballs
    removed the image's own layers (its next build failed)."""
    (tmp_path / "elsewhere").mkdir()
    write_default_config(tmp_path / "state")
    config = load_config(tmp_path / "elsewhere" / ".." / "state")
    built(config, "one")
    paths = shell_tarballs(config, "one", ["a.tar"], ["b.tar"])
    result = collect_garbage(config, shell_tarballs=True)
    assert [t["path"] for t in result["shell_tarballs_removed"]] == [str(paths["b.tar"])]
    assert paths["a.tar"].is_file()


def test_gc_keeps_a_shell_tarball_a_recipe_names_where_it_is(config):
    """gc's own advice is to add a kept tarball to a recipe as a `tar` layer (the README:
    `path: /ABSOLUTE/PATH.tar`); --shell-tarballs then removed the file that recipe names."""
    paths = shell_tarballs(config, "one", [], ["a.tar", "b.tar"])
    recipe = Layout.of(config).recipe_dir("site") / "image.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(f"layers:\n- {{kind: directory, path: root}}\n"
                      f"- {{kind: tar, path: {paths['a.tar']}}}\n")
    assert [t["path"] for t in collect_garbage(config)["shell_tarballs_kept"]] == [
        str(paths["b.tar"])]
    collect_garbage(config, shell_tarballs=True)
    assert paths["a.tar"].is_file() and not paths["b.tar"].exists()


def test_gc_follows_no_symlink_out_of_an_image_s_shell_folder(config, tmp_path):
    """A shell/ folder that is a symlink had every `*.tar` of the folder it names removed
    by --shell-tarballs; a `*.tar` symlink was shown with its target's size."""
    layout = Layout.of(config)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.tar").write_bytes(b"x")
    layout.image_shell_dir("one").parent.mkdir(parents=True)
    layout.image_shell_dir("one").symlink_to(outside)
    layout.image_shell_dir("two").mkdir(parents=True)
    (layout.image_shell_dir("two") / "link.tar").symlink_to(outside / "precious.tar")
    result = collect_garbage(config, shell_tarballs=True)
    assert result["shell_tarballs_removed"] == []
    assert (outside / "precious.tar").is_file()
    assert (layout.image_shell_dir("two") / "link.tar").is_symlink()


def test_gc_removes_the_half_written_tarball_of_a_killed_session_never_a_live_one(config):
    """A session killed as it wrote its tarball left `shell/.layer.*` (often as large as
    the layer) that nothing showed or removed. A session writes it under the image's lock:
    gc waits for that lock, then removes what is left, every time (a part of a tarball is
    nobody's work)."""
    layout = Layout.of(config)
    layout.image_shell_dir("one").mkdir(parents=True)
    partial = layout.image_shell_dir("one") / ".layer.k2j3"
    partial.write_bytes(b"x" * 100)
    done = []
    with locked(layout.image_lock("one")):  # a live session writing it
        worker = threading.Thread(target=lambda: done.append(collect_garbage(config)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and partial.is_file()
    worker.join(10)
    [result] = done
    assert [(t["image"], t["path"], t["size"]) for t in result["shell_partials_removed"]] == [
        ("one", str(partial), 100)]
    assert not partial.exists() and result["shell_tarballs_kept"] == []


def test_only_an_open_session_holds_off_a_build_of_its_layer_trees(config):
    """A build making a layer tree again in place (--no-cache) removed it from under an
    open shell's mount. An open session keeps its `lowers` file flocked: only then is the
    tree its; a killed shell's folder (left until the next shell on its image) is not."""
    layout = Layout.of(config)
    layout.image_shell_lock("img").parent.mkdir(parents=True)
    layout.image_shell_lock("img").write_text("4242\n")
    session = layout.shell_session("img", "k3x9")
    session.mkdir(parents=True)
    (session / "lowers").write_text("mounted\nbase\n")
    assert shell_mounting(layout, "mounted") is None  # killed: nobody holds it
    claim = claim_session(session / "lowers")
    try:
        assert shell_mounting(layout, "base") == "the image shell on img (PID 4242)"
        assert shell_mounting(layout, "other") is None
        assert shell_mounting(layout, "base") is not None  # checking twice took nothing
    finally:
        os.close(claim)
    assert shell_mounting(layout, "base") is None
