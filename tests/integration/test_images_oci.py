"""Importing OCI image layouts and docker archives the test builds itself (no registry):
layers applied in order, `.wh.` and opaque whiteouts turned into the image's whiteout list."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from provisiond.atomic import locked
from provisiond.cli import main
from provisiond.config import SHIPPED_DIR, load_config
from provisiond.errors import AlreadyExists, BuildFailed, Conflict, ExitCode, NotFound
from provisiond.images import blob_path, load_manifest
from provisiond.images import build as build_module
from provisiond.images.manifests import lock_path
from tests.waits import blocked_on_a_lock, wait_until

KERNEL = b"MZ fake kernel for the import test"


def layer_tar(entries: dict[str, bytes | None]) -> bytes:
    """A layer tarball: path -> file content, or None for a directory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


BOTTOM = {"boot": None, "boot/vmlinuz-0.0-test": KERNEL, "etc": None,
          "etc/a": b"a\n", "etc/b": b"b\n", "data": None, "data/x": None,
          "data/x/1": b"1\n", "data/x/2": b"2\n", "sbin": None, "sbin/init": b"#!/bin/sh\n"}
TOP = {"etc/.wh.a": b"", "etc/c": b"c\n", "data/x/.wh..wh..opq": b"", "data/x/3": b"3\n"}
LAST = {"etc/a": b"a again\n"}


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def oci_archive(path: Path, layers: list[bytes]) -> Path:
    """An OCI image layout tarball: oci-layout, index.json, blobs (manifest, config, layers)."""
    blobs: dict[str, bytes] = {}

    def put(data: bytes, media: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": digest, "size": len(data)}

    descriptors = [put(data, "application/vnd.oci.image.layer.v1.tar+gzip") for data in layers]
    config = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": []}}).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = put(json.dumps({"schemaVersion": 2, "config": config,
                               "layers": descriptors}).encode(),
                   "application/vnd.oci.image.manifest.v1+json")
    with tarfile.open(path, "w") as tar:
        add_bytes(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add_bytes(tar, "index.json", json.dumps({"schemaVersion": 2,
                                                 "manifests": [manifest]}).encode())
        for digest, data in blobs.items():
            add_bytes(tar, "blobs/sha256/" + digest.split(":")[1], data)
    return path


def docker_archive(path: Path, layers: list[bytes]) -> Path:
    """A `docker save` style tarball: manifest.json naming <id>/layer.tar files."""
    with tarfile.open(path, "w") as tar:
        names = []
        for number, data in enumerate(layers):
            names.append(f"{number:064x}/layer.tar")
            add_bytes(tar, names[-1], data)
        add_bytes(tar, "config.json", b"{}")
        add_bytes(tar, "manifest.json", json.dumps([{"Config": "config.json",
                                                     "RepoTags": ["t:1"],
                                                     "Layers": names}]).encode())
    return path


def unpack_image(config, manifest: dict, dest: Path) -> list[str]:
    """Unpack with the real cpio tool, apply the whiteout list; returns the list."""
    dest.mkdir()
    for layer in manifest["layers"]:
        data = zstandard.ZstdDecompressor().decompressobj().decompress(
            blob_path(config, layer["digest"]).read_bytes())
        subprocess.run(["cpio", "-idmu", "--quiet"], input=data, cwd=dest, check=True)
    listed = (dest / ".provisiond/whiteouts").read_text().split()
    for path in listed:
        target = dest / path.lstrip("/")
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    return listed


def tree(root: Path) -> dict[str, bytes | None]:
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if not rel.startswith(".provisiond"):
            found[rel] = None if path.is_dir() else path.read_bytes()
    return found


@pytest.mark.parametrize("make", [oci_archive, docker_archive])
def test_import_applies_layers_and_whiteouts(cli, config, tmp_path, make):
    layers = [gzip.compress(layer_tar(BOTTOM), mtime=0), layer_tar(TOP)]
    archive = make(tmp_path / "image.tar", layers)
    result = cli("image", "import", str(archive), "imported", "--kernel-arg", "quiet")
    assert result.code == 0, result.err
    manifest = load_manifest(config, "imported")
    assert [l["kind"] for l in manifest["layers"]] == ["oci-archive", "oci-archive"]
    assert blob_path(config, manifest["kernel"]["digest"]).read_bytes() == KERNEL
    assert manifest["kernel"]["version"] == "0.0-test" and manifest["kernel_args"] == ["quiet"]
    listed = unpack_image(config, manifest, tmp_path / "root")
    assert listed == ["/data/x/1", "/data/x/2", "/etc/a"]
    files = tree(tmp_path / "root")
    assert files == {"boot": None, "data": None, "data/x": None, "data/x/3": b"3\n",
                     "etc": None, "etc/b": b"b\n", "etc/c": b"c\n", "sbin": None,
                     "sbin/init": b"#!/bin/sh\n"}


@pytest.mark.parametrize("make", [oci_archive, docker_archive])
def test_an_archive_made_with_tar_of_its_folder_imports(cli, config, tmp_path, make):
    """`tar -C layout -cf image.tar .` (GNU tar, as an admin packs a layout folder) names
    every entry ./index.json, ./blobs/...: it imported only without the ./ prefix ("archive
    has no file index.json", exit 5)."""
    layers = [gzip.compress(layer_tar(BOTTOM), mtime=0), layer_tar(TOP)]
    made = make(tmp_path / "made.tar", layers)
    folder = tmp_path / "layout"
    folder.mkdir()
    subprocess.run(["tar", "-C", str(folder), "-xf", str(made)], check=True)
    archive = tmp_path / "image.tar"
    subprocess.run(["tar", "-C", str(folder), "-cf", str(archive), "."], check=True)
    with tarfile.open(archive) as tar:
        assert all(name == "." or name.startswith("./") for name in tar.getnames())
    result = cli("image", "import", str(archive), "dotted")
    assert result.code == 0, result.err
    listed = unpack_image(config, load_manifest(config, "dotted"), tmp_path / "root")
    assert listed == ["/data/x/1", "/data/x/2", "/etc/a"]
    assert tree(tmp_path / "root")["etc/c"] == b"c\n"


@pytest.mark.parametrize("outside", ["../outside.tar", "ABSOLUTE", "LINK"])
def test_a_folder_archive_naming_a_file_outside_it_is_refused(cli, config, tmp_path, outside):
    """A docker archive folder (docker save, unpacked) whose manifest.json names a layer
    outside the folder: the import read that host file as a layer (as root, into an image
    served to every node). It is one line now, and no image is made."""
    folder = tmp_path / "saved"
    folder.mkdir()
    host_file = tmp_path / "outside.tar"
    host_file.write_bytes(layer_tar(BOTTOM))
    name = str(host_file) if outside == "ABSOLUTE" else outside
    if outside == "LINK":  # a symlink in the folder to the host file: the copy followed it
        name = "layer.tar"
        (folder / name).symlink_to(host_file)
    (folder / "config.json").write_text("{}")
    (folder / "manifest.json").write_text(json.dumps(
        [{"Config": "config.json", "RepoTags": ["t:1"], "Layers": [name]}]))
    result = cli("image", "import", str(folder), "outside")
    assert result.code != 0
    last = result.err.splitlines()[-1]  # after the build's progress lines
    assert last.startswith("provisiond: error: ") and (
        "is outside the archive" in last or "links outside the archive folder" in last), \
        result.err
    assert "Traceback" not in result.err
    assert cli("image", "show", "outside").code != 0


def test_recreated_path_is_not_whited_out(cli, config, tmp_path):
    layers = [layer_tar(BOTTOM), layer_tar(TOP), layer_tar(LAST)]
    archive = oci_archive(tmp_path / "image.tar", layers)
    assert cli("image", "import", str(archive), "again").code == 0
    manifest = load_manifest(config, "again")
    listed = unpack_image(config, manifest, tmp_path / "root")
    assert listed == ["/data/x/1", "/data/x/2"]
    assert (tmp_path / "root/etc/a").read_bytes() == b"a again\n"


def test_reimport_reuses_layers_and_bad_archive_fails_cleanly(cli, config, tmp_path):
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM), layer_tar(TOP)])
    assert cli("image", "import", str(archive), "reused").code == 0
    first = load_manifest(config, "reused")
    assert cli("image", "build", "reused").code == 0
    result = cli("image", "build", "reused")
    assert "building" not in result.err and result.err.count("cached") == 2
    assert [l["digest"] for l in load_manifest(config, "reused")["layers"]] == [
        l["digest"] for l in first["layers"]]
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    result = cli("image", "import", str(tmp_path / "junk.tar"), "reused", "--force")
    assert result.code != 0 and result.err.count("\n") == 1, result.err
    assert "recipe reused: layer 1 (oci-archive)" in result.err
    assert load_manifest(config, "reused")["layers"] == first["layers"]


def test_entry_through_a_symlink_out_of_the_image_is_refused(cli, config, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        add_bytes(tar, "evil/planted", b"x")
    archive = oci_archive(tmp_path / "image.tar", [buffer.getvalue()])
    result = cli("image", "import", str(archive), "evil")
    assert result.code != 0 and "points outside the image" in result.err
    assert not (outside / "planted").exists()


@pytest.mark.parametrize("entry", ["evil/.wh.victim", "evil/.wh..wh..opq"])
def test_whiteout_through_a_symlink_out_of_the_image_is_refused(cli, tmp_path, entry):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        add_bytes(tar, entry, b"")
    archive = oci_archive(tmp_path / "image.tar", [buffer.getvalue()])
    result = cli("image", "import", str(archive), "evil")
    assert result.code != 0 and "points outside the image" in result.err
    assert (outside / "victim").read_text() == "keep me\n"
    assert "trusted.overlay.opaque" not in os.listxattr(outside)


@pytest.mark.parametrize("target", ["evil/secret", "file-link", "ABSOLUTE"])
def test_hard_link_out_of_the_image_is_refused(cli, tmp_path, target):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        file_link = tarfile.TarInfo("file-link")
        file_link.type, file_link.linkname = tarfile.SYMTYPE, str(outside / "secret")
        tar.addfile(file_link)
        hard = tarfile.TarInfo("stolen")
        hard.type = tarfile.LNKTYPE
        hard.linkname = str(outside / "secret") if target == "ABSOLUTE" else target
        tar.addfile(hard)
    archive = oci_archive(tmp_path / "image.tar", [buffer.getvalue()])
    result = cli("image", "import", str(archive), "evil")
    assert result.code != 0 and "Traceback" not in result.err
    # an absolute link name is taken inside the layer, where it names nothing
    expected = "not a readable layer" if target == "ABSOLUTE" else "points outside the image"
    assert expected in result.err
    assert os.stat(outside / "secret").st_nlink == 1


def test_directory_base_keeps_modes_and_owners(cli, config, state_dir, tmp_path):
    folder = state_dir / "recipes" / "fromdir"
    (folder / "rootfs/boot").mkdir(parents=True)
    (folder / "rootfs/boot/vmlinuz-0.0-dir").write_bytes(KERNEL)
    (folder / "rootfs/sbin").mkdir()
    (folder / "rootfs/sbin/init").write_text("#!/bin/sh\n")
    os.chmod(folder / "rootfs/sbin/init", 0o750)
    os.chown(folder / "rootfs/sbin/init", 0, 42)
    (folder / "image.yaml").write_text("layers:\n  - {kind: directory, path: rootfs}\n")
    assert cli("image", "build", "fromdir").code == 0
    manifest = load_manifest(config, "fromdir")
    assert manifest["kernel"]["version"] == "0.0-dir"
    assert unpack_image(config, manifest, tmp_path / "root") == []
    init = (tmp_path / "root/sbin/init").stat()
    assert init.st_mode & 0o777 == 0o750 and init.st_gid == 42
    assert not (tmp_path / "root/boot/vmlinuz-0.0-dir").exists()


def test_copied_folder_follows_the_images_absolute_symlinks_inside_the_image(
        cli, config, state_dir, tmp_path):
    outside = tmp_path / "host-run"
    outside.mkdir()
    folder = state_dir / "recipes" / "linked"
    (folder / "rootfs/boot").mkdir(parents=True)
    (folder / "rootfs/boot/vmlinuz-0.0-dir").write_bytes(KERNEL)
    (folder / "rootfs/var").mkdir()
    (folder / "rootfs/var/run").symlink_to(outside)  # like Debian's /var/run -> /run
    (folder / "extra/run").mkdir(parents=True)
    (folder / "extra/run/planted").write_text("x\n")
    (folder / "extra/run/link").symlink_to("/etc/passwd")
    (folder / "image.yaml").write_text(
        "layers:\n  - {kind: directory, path: rootfs}\n"
        "  - {kind: copy, files: [{src: extra, dest: /var}]}\n")
    result = cli("image", "build", "linked")
    assert result.code == 0, result.err
    assert list(outside.iterdir()) == []
    unpack_image(config, load_manifest(config, "linked"), tmp_path / "root")
    inside = tmp_path / "root" / str(outside).lstrip("/")
    assert (inside / "planted").read_text() == "x\n"
    assert os.readlink(inside / "link") == "/etc/passwd"


@pytest.mark.parametrize("name", ["../escaped", "a/b", ".hidden"])
def test_import_refuses_a_bad_name_before_writing_anything(cli, config, tmp_path, name):
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    result = cli("image", "import", str(archive), name)
    assert result.code != 0 and result.err.count("\n") == 1, result.err
    assert "not an image name" in result.err
    assert not (config.state_dir / "escaped").exists()
    assert not (config.state_dir / "recipes").exists()


@pytest.mark.parametrize("over", ["--force", "--update"])
def test_failed_reimport_keeps_the_previous_archive_and_recipe(cli, config, tmp_path, over):
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM), layer_tar(TOP)])
    assert cli("image", "import", str(archive), "kept").code == 0
    listed = with_a_shell_layer(cli, config, "kept")
    before = load_manifest(config, "kept")
    recipe = (config.state_dir / "recipes/kept/image.yaml").read_text()
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    assert cli("image", "import", str(tmp_path / "junk.tar"), "kept", over).code != 0
    assert (config.state_dir / "recipes/kept/image.yaml").read_text() == recipe
    assert load_manifest(config, "kept") == before
    assert (config.images_dir / "kept/shell.json").read_text() == listed
    rebuilt = cli("image", "build", "kept")
    assert rebuilt.code == 0, rebuilt.err
    assert [l["digest"] for l in load_manifest(config, "kept")["layers"]] == [
        l["digest"] for l in before["layers"]]
    assert sorted(p.name for p in (config.state_dir / "recipes").iterdir()) == ["kept"]


SHELL_MADE = {"etc": None, "etc/shell-made": b"from an image shell\n"}


def with_a_shell_layer(cli, config, name: str) -> str:
    """Image `name` rebuilt with one layer as `image shell` lists it (a tarball in
    images/NAME/shell/, its entry in shell.json); returns the listing's text."""
    folder = config.images_dir / name / "shell"
    folder.mkdir(parents=True)
    (folder / "made.tar").write_bytes(layer_tar(SHELL_MADE))
    listing = json.dumps([{"path": "shell/made.tar", "description": "image shell: x"}])
    (config.images_dir / name / "shell.json").write_text(listing)
    result = cli("image", "build", name)
    assert result.code == 0, result.err
    assert load_manifest(config, name)["layers"][-1]["kind"] == "tar"
    return listing


def test_an_import_over_an_existing_image_is_refused_without_force_or_update(
        cli, config, tmp_path):
    """An import over a built image replaced its recipe and kept the layers `image shell`
    added to it, now on top of other content: an image whose shell layers were made on
    another base, not said. Refused in one line now (as `wwctl image import` refuses an
    existing name without --force or --update); the image, its recipe and layers stay."""
    first = oci_archive(tmp_path / "first.tar", [layer_tar(BOTTOM)])
    other = oci_archive(tmp_path / "other.tar", [layer_tar({**BOTTOM, "etc/b": b"B\n"})])
    assert cli("image", "import", str(first), "site").code == 0
    recipe = (config.state_dir / "recipes/site/image.yaml").read_text()
    result = cli("image", "import", str(other), "site")
    assert result.code == AlreadyExists.exit_code, result.err
    assert result.err.splitlines() == [
        "provisiond: error: image site already exists: --force replaces it"]
    listed = with_a_shell_layer(cli, config, "site")
    before = load_manifest(config, "site")
    result = cli("image", "import", str(other), "site")
    assert result.err.splitlines() == [
        "provisiond: error: image site already exists, with 1 layer `image shell` added: "
        "--force replaces it and drops them, --update imports under them"]
    assert load_manifest(config, "site") == before
    assert (config.state_dir / "recipes/site/image.yaml").read_text() == recipe
    assert (config.images_dir / "site/shell.json").read_text() == listed


def test_an_import_with_force_replaces_the_image_and_drops_its_shell_layers(
        cli, config, tmp_path):
    first = oci_archive(tmp_path / "first.tar", [layer_tar(BOTTOM)])
    other = oci_archive(tmp_path / "other.tar", [layer_tar({**BOTTOM, "etc/b": b"B\n"})])
    assert cli("image", "import", str(first), "forced").code == 0
    with_a_shell_layer(cli, config, "forced")
    before = load_manifest(config, "forced")
    result = cli("image", "import", str(other), "forced", "--force")
    assert result.code == 0, result.err
    after = load_manifest(config, "forced")
    assert [l["kind"] for l in after["layers"]] == ["oci-archive"]
    assert after["generation"] not in ("", before["generation"])  # another image
    assert not (config.images_dir / "forced/shell.json").exists()
    assert not (config.images_dir / "forced/shell").exists()
    root = tmp_path / "root"
    unpack_image(config, after, root)
    assert (root / "etc/b").read_bytes() == b"B\n" and not (root / "etc/shell-made").exists()
    result = cli("image", "build", "forced")
    assert result.code == 0 and load_manifest(config, "forced")["layers"] == after["layers"]


def test_an_import_with_update_keeps_the_shell_layers_on_top(cli, config, tmp_path):
    first = oci_archive(tmp_path / "first.tar", [layer_tar(BOTTOM)])
    other = oci_archive(tmp_path / "other.tar", [layer_tar({**BOTTOM, "etc/b": b"B\n"})])
    assert cli("image", "import", str(first), "updated").code == 0
    listed = with_a_shell_layer(cli, config, "updated")
    before = load_manifest(config, "updated")
    result = cli("image", "import", str(other), "updated", "--update")
    assert result.code == 0, result.err
    after = load_manifest(config, "updated")
    assert [l["kind"] for l in after["layers"]] == ["oci-archive", "tar"]
    assert after["layers"][-1]["description"] == before["layers"][-1]["description"]
    assert after["generation"] == before["generation"]  # the same image, updated
    assert (config.images_dir / "updated/shell.json").read_text() == listed
    root = tmp_path / "root"
    unpack_image(config, after, root)
    assert (root / "etc/b").read_bytes() == b"B\n"
    assert (root / "etc/shell-made").read_bytes() == b"from an image shell\n"


@pytest.mark.parametrize("over", ["--force", "--update"])
def test_an_interrupt_once_the_import_s_manifest_is_saved_keeps_the_import(
        cli, config, tmp_path, monkeypatch, over):
    """Ctrl-C (or SIGTERM) landing after the import's manifest was saved, before the build
    returned: the undo put the previous recipe folder back under the new manifest (and
    --force left the replaced image's shell layers listed), so the next `image build`
    made the previous image again, with --force's dropped shell layers on top and the
    new generation. The save is the import's commit: it stands, and is finished."""
    first = oci_archive(tmp_path / "first.tar", [layer_tar(BOTTOM)])
    other = oci_archive(tmp_path / "other.tar", [layer_tar({**BOTTOM, "etc/b": b"B\n"})])
    assert cli("image", "import", str(first), "cut").code == 0
    with_a_shell_layer(cli, config, "cut")
    real = build_module.save_manifest

    def save_then_interrupt(*args):
        real(*args)
        os.kill(os.getpid(), signal.SIGINT)  # a KeyboardInterrupt before the build returns

    monkeypatch.setattr(build_module, "save_manifest", save_then_interrupt)
    result = cli("image", "import", str(other), "cut", over)
    monkeypatch.undo()
    imported = load_manifest(config, "cut")
    assert cli("image", "build", "cut").code == 0
    assert load_manifest(config, "cut")["layers"] == imported["layers"], result.err
    assert result.code == 0, result.err  # the import is done: the interrupt came after
    kinds = [l["kind"] for l in imported["layers"]]
    assert kinds == (["oci-archive"] if over == "--force" else ["oci-archive", "tar"])
    assert (config.images_dir / "cut/shell.json").exists() == (over == "--update")
    root = tmp_path / "root"
    unpack_image(config, imported, root)
    assert (root / "etc/b").read_bytes() == b"B\n"
    assert sorted(p.name for p in (config.state_dir / "recipes").iterdir()) == ["cut"]


def test_a_second_ctrl_c_as_a_failed_import_is_undone_keeps_the_recipe(
        cli, config, tmp_path, monkeypatch):
    """A failed import removed its own recipe folder, then put the previous one back: a
    second Ctrl-C during that removal (seconds for a large archive) left the image with
    no recipe folder, the previous one aside where the next import removed it. The
    folders are swapped back first now, by two renames, then the failed one removed."""
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM), layer_tar(TOP)])
    assert cli("image", "import", str(archive), "undone").code == 0
    recipe = (config.state_dir / "recipes/undone/image.yaml").read_text()
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    recipes, real = config.state_dir / "recipes", shutil.rmtree

    def rmtree_then_interrupt(path, *args, **kwargs):
        removed = Path(path).parent == recipes and Path(path).name != ".undone.import" \
            and Path(path).exists()  # the failed import's own recipe folder
        real(path, *args, **kwargs)
        if removed:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(shutil, "rmtree", rmtree_then_interrupt)
    result = cli("image", "import", str(tmp_path / "junk.tar"), "undone", "--update")
    monkeypatch.undo()
    assert result.code == ExitCode.INTERRUPTED, result.err
    assert (recipes / "undone/image.yaml").read_text() == recipe
    assert cli("image", "build", "undone").code == 0


HANGUP_AT_SAVE = """
import os, signal, sys
from provisiond.cli import main
from provisiond.images import build

def hang_up(*args):  # the ssh session drops as the build is about to save
    os.kill(os.getpid(), signal.SIGHUP)  # its handler runs here, or the process ends

build.save_manifest = hang_up
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("verb", ["import", "build"])
def test_a_hangup_stops_an_import_or_build_as_ctrl_c_does(cli, config, tmp_path, verb):
    """A dropped ssh session (SIGHUP) during `image import`'s build ended the process at
    once: the recipe folder stayed swapped, the previous one aside (removed by the next
    import), so the next `image build` made the half-done import's image (--force: under
    the replaced image's shell layers); a build's chroot mounts were left in place. A
    hangup now stops both as Ctrl-C and SIGTERM do: undone, exit 130."""
    first = oci_archive(tmp_path / "first.tar", [layer_tar(BOTTOM)])
    other = oci_archive(tmp_path / "other.tar", [layer_tar({**BOTTOM, "etc/b": b"B\n"})])
    assert cli("image", "import", str(first), "hungup").code == 0
    before = load_manifest(config, "hungup")
    args = ["image", "import", str(other), "hungup", "--force"] if verb == "import" else [
        "image", "build", "hungup", "--no-cache"]
    run = subprocess.run([sys.executable, "-c", HANGUP_AT_SAVE, "--state-dir",
                          str(config.state_dir), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == ExitCode.INTERRUPTED, (run.returncode, run.stderr)
    assert run.stderr.splitlines()[-1] == "provisiond: interrupted", run.stderr
    assert sorted(p.name for p in (config.state_dir / "recipes").iterdir()) == ["hungup"]
    assert load_manifest(config, "hungup") == before
    assert cli("image", "build", "hungup").code == 0
    assert load_manifest(config, "hungup")["layers"] == before["layers"]


KILLED_AT = """
import os, pathlib, signal, sys
from provisiond.cli import main
from provisiond.images import build

WHEN, NAME = sys.argv.pop(1), sys.argv[-2]
save, rename = build.save_manifest, pathlib.Path.rename

def kill():  # the OOM killer, a power cut
    os.kill(os.getpid(), signal.SIGKILL)

def save_manifest(*args):
    if WHEN == "after the save":
        save(*args)
    kill()

def swap(self, target):
    if WHEN == "between the renames" and self.name == f".{NAME}.import":
        kill()
    return rename(self, target)

build.save_manifest, pathlib.Path.rename = save_manifest, swap
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("then", ["build", "import"])
@pytest.mark.parametrize("when", ["between the renames", "before the save", "after the save"])
def test_an_import_killed_outright_is_undone_or_finished_by_the_next_build_or_import(
        cli, config, tmp_path, when, then):
    """`image import --force` killed outright (SIGKILL, the OOM killer, a power cut) as
    it built: its recipe folder stayed swapped in, unbuilt, the previous one aside, where
    the next import removed it; the next build made the killed import's image under the
    replaced image's shell layers, with its generation (so an open shell's layer went on
    top too). Killed once its manifest was saved: those shell layers stayed listed. The
    next build, shell exit or import of the image ends the swap first now: the image as
    it was, or the import finished."""
    first = oci_archive(tmp_path / "first.tar", [layer_tar(BOTTOM)])
    other = oci_archive(tmp_path / "other.tar", [layer_tar({**BOTTOM, "etc/b": b"B\n"})])
    assert cli("image", "import", str(first), "killed").code == 0
    listed = with_a_shell_layer(cli, config, "killed")
    before = load_manifest(config, "killed")
    run = subprocess.run([sys.executable, "-c", KILLED_AT, when, "--state-dir",
                          str(config.state_dir), "image", "import", str(other), "killed",
                          "--force"], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    if then == "import":  # one that fails: it changes nothing of itself
        (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
        result = cli("image", "import", str(tmp_path / "junk.tar"), "killed", "--update")
        assert result.code == BuildFailed.exit_code, result.err
    result = cli("image", "build", "killed")
    assert result.code == 0, result.err
    after = load_manifest(config, "killed")
    if when == "after the save":
        assert [l["kind"] for l in after["layers"]] == ["oci-archive"]
        assert after["generation"] not in ("", before["generation"])
        assert not (config.images_dir / "killed/shell.json").exists()
        root = tmp_path / "root"
        unpack_image(config, after, root)
        assert (root / "etc/b").read_bytes() == b"B\n"
    else:
        assert after["layers"] == before["layers"]
        assert after["generation"] == before["generation"]
        assert (config.images_dir / "killed/shell.json").read_text() == listed
    recipes = config.state_dir / "recipes"
    assert not any((recipes / aside).exists() for aside in (
        ".killed.previous", ".killed.failed", "killed/.import.json"))


def test_an_import_over_a_recipe_folder_not_built_is_refused(cli, config, tmp_path):
    """A site recipe written into <state>/recipes/NAME (or a deleted image's import):
    the import moved it aside and removed it once it had built."""
    folder = config.state_dir / "recipes/written"
    folder.mkdir(parents=True)
    (folder / "image.yaml").write_text("layers:\n  - {kind: busybox}\n")
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    result = cli("image", "import", str(archive), "written")
    assert result.code == AlreadyExists.exit_code, result.err
    assert result.err.splitlines() == [
        f"provisiond: error: image written is not built but has a recipe folder, {folder}: "
        "--force replaces it"]
    assert (folder / "image.yaml").read_text() == "layers:\n  - {kind: busybox}\n"
    assert cli("image", "import", str(archive), "written", "--force").code == 0
    assert load_manifest(config, "written")["layers"][0]["kind"] == "oci-archive"


def provisiond(config, *args: str) -> subprocess.Popen:
    """`provisiond ARGS...` as a process of its own, on the test's state dir."""
    return subprocess.Popen([sys.executable, "-m", "provisiond", "--state-dir",
                             str(config.state_dir), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_build_that_waited_for_the_image_s_lock_builds_what_is_listed_then(
        cli, config, tmp_path):
    """`image build` read the recipe and the image's shell layers before it took the
    image's lock: one that waited for an `image shell`'s exit (which lists its layer and
    rebuilds under that lock) then saved the image without the session's layer, the
    admin's work gone from what nodes boot until the next build, the shell having said
    it was added. The build reads them once it holds the lock now."""
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    assert cli("image", "import", str(archive), "waited").code == 0
    with locked(lock_path(config, "waited")):  # as a shell's exit holds it
        build = provisiond(config, "image", "build", "waited")
        wait_until(lambda: build.poll() is not None or blocked_on_a_lock(build.pid), 60,
                   "the build to wait for the image's lock")
        folder = config.images_dir / "waited/shell"
        folder.mkdir(parents=True)
        (folder / "made.tar").write_bytes(layer_tar(SHELL_MADE))
        (config.images_dir / "waited/shell.json").write_text(json.dumps(
            [{"path": "shell/made.tar", "description": "image shell: x"}]))
    out, _ = build.communicate(timeout=120)
    assert build.returncode == 0, out
    assert [l["kind"] for l in load_manifest(config, "waited")["layers"]] == [
        "oci-archive", "tar"], out


def test_deleted_name_with_a_newline_never_lists_another_path(cli, config, tmp_path):
    """The whiteout list has one path per line: deleting the file etc in a folder named
    "x\\n" (/etc/x\\n/etc) must not make the node's /init remove /etc."""
    bottom = {**BOTTOM, "etc/x\n": None, "etc/x\n/etc": b"tricky\n"}
    layers = [layer_tar(bottom), layer_tar({"etc/x\n/.wh.etc": b""})]
    archive = oci_archive(tmp_path / "image.tar", layers)
    result = cli("image", "import", str(archive), "tricky")
    last = result.err.splitlines()[-1]
    assert result.code == BuildFailed.exit_code and "Traceback" not in result.err, result.err
    assert last.startswith("provisiond: error: image tricky: ")
    assert "deletes '/etc/x\\n/etc', whose name has a newline" in last
    with pytest.raises(NotFound):
        load_manifest(config, "tricky")


def test_names_starting_with_two_dots_are_files_not_escapes(cli, config, tmp_path):
    """Only `..` itself climbs out; `..data` (as Kubernetes names its folders) is a name."""
    archive = oci_archive(tmp_path / "image.tar", [layer_tar({**BOTTOM, "..data": b"d\n"})])
    assert cli("image", "import", str(archive), "dots").code == 0
    unpack_image(config, load_manifest(config, "dots"), tmp_path / "root")
    assert (tmp_path / "root/..data").read_bytes() == b"d\n"


def test_image_of_many_layers_builds(cli, config, tmp_path):
    """Overlayfs takes its lower dirs in one mount option of at most a page (4 KiB): 48
    absolute layer paths did not fit."""
    layers = [layer_tar(BOTTOM)] + [layer_tar({f"etc/f{n}": b"%d\n" % n}) for n in range(47)]
    archive = oci_archive(tmp_path / "image.tar", layers)
    result = cli("image", "import", str(archive), "many")
    assert result.code == 0, result.err[-700:]
    assert len(load_manifest(config, "many")["layers"]) == 48


@pytest.mark.parametrize("entry", [".wh...", ".wh..", ".wh.", "etc/.wh...", "etc/.wh.."])
def test_a_whiteout_of_dot_or_dot_dot_is_refused(cli, config, tmp_path, entry):
    """`.wh...` whites out `..`: it removed the layer's parent, the whole layer cache (every
    image's cached trees); `.wh..` and `.wh.` removed the layer tree itself."""
    assert cli("image", "import", str(oci_archive(tmp_path / "good.tar",
                                                  [layer_tar(BOTTOM)])), "good").code == 0
    cached = sorted(p.name for p in (config.state_dir / "cache/layers").iterdir())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        add_bytes(tar, entry, b"")
    archive = oci_archive(tmp_path / "evil.tar", [layer_tar(BOTTOM), buffer.getvalue()])
    result = cli("image", "import", str(archive), "evil")
    assert result.code == BuildFailed.exit_code and result.err.count("error") == 1, result.err
    assert "not a whiteout of a name" in result.err.splitlines()[-1]
    assert sorted(p.name for p in (config.state_dir / "cache/layers").iterdir()) == cached
    assert cli("image", "build", "good").code == 0


def test_a_layer_whose_content_is_not_its_digest_is_refused_and_never_cached(
        cli, config, tmp_path):
    """A layer is keyed by the digest its manifest names: an archive whose blob under the
    digest of a genuine layer holds other files built and cached them under the genuine
    layer's key, so a later import of the genuine image got them as 'cached'."""
    genuine = layer_tar(BOTTOM)
    evil = layer_tar({**BOTTOM, "sbin/init": b"#!/bin/sh\necho planted\n"})
    digest = hashlib.sha256(genuine).hexdigest()
    archive = oci_archive(tmp_path / "evil.tar", [genuine])
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(archive, "w") as tar:
        for member, data in members:
            add_bytes(tar, member.name, evil if member.name.endswith(digest) else data)
    result = cli("image", "import", str(archive), "evil")
    assert result.code == BuildFailed.exit_code and "Traceback" not in result.err, result.err
    assert f"does not match its digest sha256:{digest}" in result.err.splitlines()[-1]
    result = cli("image", "import", str(oci_archive(tmp_path / "good.tar", [genuine])), "good")
    assert result.code == 0 and "cached" not in result.err, result.err
    unpack_image(config, load_manifest(config, "good"), tmp_path / "root")
    assert (tmp_path / "root/sbin/init").read_bytes() == b"#!/bin/sh\n"


@pytest.mark.parametrize("name, data, message", [
    ("index.json", b"[]", "is not a readable OCI or docker archive"),
    ("manifest.json", b'["x"]', "is not a readable OCI or docker archive"),
    ("index.json", b'{"manifests": [[]]}', "the index lists no manifests")])
def test_an_archive_index_of_the_wrong_shape_is_one_line(cli, config, tmp_path, name, data,
                                                         message):
    archive = tmp_path / "odd.tar"
    with tarfile.open(archive, "w") as tar:
        add_bytes(tar, name, data)
    result = cli("image", "import", str(archive), "odd")
    assert result.code == BuildFailed.exit_code and result.err.count("\n") == 1, result.err
    assert message in result.err


# cap_net_raw+ep as setcap writes it (VFS_CAP_REVISION_2, effective; permitted bit 13)
CAP_NET_RAW = bytes([0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])


def xattr_layer(records: dict[str, bytes]) -> io.BytesIO:
    """One file, bin/ping, carrying `records` as SCHILY.xattr PAX records."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("bin/ping")
        info.size, info.mode = 4, 0o755
        info.pax_headers = {f"SCHILY.xattr.{name}": value.decode("utf-8", "surrogateescape")
                            for name, value in records.items()}
        tar.addfile(info, io.BytesIO(b"ping"))
    buffer.seek(0)
    return buffer


@pytest.mark.skipif(os.geteuid() != 0, reason="file capabilities need root")
def test_a_layers_xattrs_reach_the_layer_tree_less_overlay_and_selinux_ones(tmp_path):
    """File capabilities (ping's cap_net_raw, set by setcap in an image shell or a registry
    image) and user.* attributes are kept; overlayfs's bookkeeping and the SELinux label of
    the host that made the layer are not."""
    from provisiond.images.oci import apply_layer

    apply_layer(xattr_layer({"security.capability": CAP_NET_RAW, "user.site": b"pvlab",
                             "trusted.overlay.opaque": b"y",
                             "security.selinux": b"system_u:object_r:bin_t:s0"}), tmp_path)
    ping = str(tmp_path / "bin" / "ping")
    assert os.getxattr(ping, "security.capability") == CAP_NET_RAW
    assert os.getxattr(ping, "user.site") == b"pvlab"
    assert not {"trusted.overlay.opaque", "security.selinux"} & set(os.listxattr(ping))


@pytest.mark.skipif(os.geteuid() != 0, reason="file capabilities need root")
def test_hard_links_keep_the_capabilities_of_their_file_from_gnu_tar(tmp_path):
    """GNU tar records a file's xattrs on its first entry only, not on the hard links to it
    that follow (ping and ping6 one file). Extracting a hard link chowns it, and a chown
    drops the file capabilities of the inode: ping lost its cap_net_raw."""
    from provisiond.images.oci import apply_layer

    tar = shutil.which("tar")
    if tar is None or "GNU tar" not in subprocess.run([tar, "--version"], capture_output=True,
                                                      text=True).stdout:
        pytest.skip("GNU tar is not installed")
    source = tmp_path / "source"
    (source / "bin").mkdir(parents=True)
    (source / "bin/ping").write_bytes(b"ping")
    os.setxattr(source / "bin/ping", "security.capability", CAP_NET_RAW)
    os.link(source / "bin/ping", source / "bin/ping6")
    subprocess.run([tar, "--xattrs", "--xattrs-include=*", "--format=posix", "-cf",
                    str(tmp_path / "layer.tar"), "bin"], cwd=source, check=True)
    with tarfile.open(tmp_path / "layer.tar") as layer:  # as GNU tar writes them
        assert [(m.name, any(k.startswith("SCHILY.xattr.") for k in m.pax_headers))
                for m in layer if not m.isdir()] == [("bin/ping", True), ("bin/ping6", False)]
    root = tmp_path / "root"
    root.mkdir()
    with open(tmp_path / "layer.tar", "rb") as blob:
        apply_layer(blob, root)
    assert os.stat(root / "bin/ping").st_ino == os.stat(root / "bin/ping6").st_ino
    assert os.getxattr(root / "bin/ping", "security.capability") == CAP_NET_RAW


@pytest.mark.skipif(os.geteuid() != 0, reason="file capabilities need root")
def test_an_xattr_the_host_refuses_is_one_line(tmp_path):
    from provisiond.images.oci import apply_layer

    with pytest.raises(BuildFailed) as failed:
        apply_layer(xattr_layer({"security.capability": b"\xff junk"}), tmp_path)
    assert str(failed.value).splitlines() == [
        "layer entry 'bin/ping': cannot set its xattr security.capability: Invalid argument"]


def test_an_import_shadowed_by_a_site_recipe_is_refused(cli, state_dir, tmp_path):
    """A recipe of the name in a folder of the settings' image_dirs is found before the one
    the import writes to <state>/recipes/NAME: the import reported success and built the
    site recipe instead (here: the directory tree, not the archive's layers)."""
    site = tmp_path / "site"
    (site / "shadowed/tree/boot").mkdir(parents=True)
    (site / "shadowed/tree/boot/vmlinuz-0.0-site").write_bytes(KERNEL)
    (site / "shadowed/image.yaml").write_text(
        "layers:\n  - {kind: directory, path: tree}\n")
    (state_dir / "provisiond.yaml").write_text(f"image_dirs: [{site}]\n")
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    for flags in ((), ("--force",)):
        result = cli("image", "import", str(archive), "shadowed", *flags)
        assert result.code == Conflict.exit_code, result.err
        assert result.err.splitlines() == [
            f"provisiond: error: image shadowed: the recipe {site}/shadowed/image.yaml "
            f"shadows the one an import writes ({state_dir}/recipes/shadowed): import under "
            "another name"], result.err
    assert not (state_dir / "recipes").exists()


def test_an_import_to_a_shipped_recipe_s_name_is_refused_without_force(cli, state_dir,
                                                                        tmp_path):
    """`image import SOURCE tiny` wrote <state>/recipes/tiny, which shadows the shipped
    recipe of that name from then on, and said nothing of it. Refused in one line naming
    the recipe it would shadow (exit 4, as an import over an existing image); --force
    imports."""
    shipped = SHIPPED_DIR / "images/tiny/image.yaml"
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    result = cli("image", "import", str(archive), "tiny")
    assert result.code == AlreadyExists.exit_code, result.err
    assert result.err.splitlines() == [
        f"provisiond: error: image tiny has a shipped recipe, {shipped}: an import would "
        f"shadow it (until {state_dir}/recipes/tiny is removed); --force imports anyway"]
    assert not (state_dir / "recipes").exists()
    result = cli("image", "import", str(archive), "tiny", "--update")
    assert result.code == AlreadyExists.exit_code, result.err
    assert result.err.splitlines() == [
        f"provisiond: error: image tiny is not built but has a shipped recipe, {shipped}: "
        "--update has no image to import into, and an import would shadow the recipe (until "
        f"{state_dir}/recipes/tiny is removed); --force imports anyway"]
    assert not (state_dir / "recipes").exists()
    result = cli("image", "import", str(archive), "tiny", "--force")
    assert result.code == 0, result.err
    manifest = load_manifest(load_config(state_dir), "tiny")
    assert manifest["recipe"]["path"] == str(state_dir / "recipes/tiny/image.yaml")
    assert [l["kind"] for l in manifest["layers"]] == ["oci-archive"]
