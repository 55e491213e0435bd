"""Image builds end to end: the shipped tiny recipe from real Debian packages, unpacked with
the real cpio tool; layer reuse, reproducibility, whiteouts, failures, locking, CLI."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisiond import events as journal
from provisiond.cli import main
from provisiond.config import SHIPPED_DIR, load_config, write_default_config
from provisiond.images import blob_path, build_image, load_manifest
from provisiond.images.cpio import MTIME_CLAMP
from tests.tools import private_deb_cache

# Downloads Debian packages (busybox-static, the kernel) and mounts overlayfs (root).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def deb_cache(tmp_path_factory):
    """A cache dir for this module holding only the downloaded .debs, so the first tiny
    build below really unpacks them."""
    old = os.environ.get("PROVISIOND_CACHE_DIR")
    os.environ["PROVISIOND_CACHE_DIR"] = str(private_deb_cache(tmp_path_factory.mktemp("cache")))
    yield
    os.environ.pop("PROVISIOND_CACHE_DIR")
    if old is not None:
        os.environ["PROVISIOND_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def lab(tmp_path_factory, deb_cache):
    """A state dir with tiny built once, and a recipe dir tests add their recipes to."""
    root = tmp_path_factory.mktemp("images")
    state, recipes = root / "state", root / "recipes"
    recipes.mkdir()
    write_default_config(state)
    (state / "provisiond.yaml").write_text(yaml.safe_dump({"image_dirs": [str(recipes)]}))
    config = load_config(state)
    events: list[dict] = []
    manifest = build_image(config, "tiny", progress=events.append)
    return {"config": config, "recipes": recipes, "manifest": manifest, "events": events}


def add_recipe(lab, name: str, recipe: dict, files: dict[str, str] | None = None) -> Path:
    folder = lab["recipes"] / name
    folder.mkdir(exist_ok=True)
    (folder / "image.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    for rel, text in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def unpack(config, manifest: dict, dest: Path) -> Path:
    """Unpack every layer in order with the real cpio tool, as the kernel would."""
    dest.mkdir(parents=True, exist_ok=True)
    for layer in manifest["layers"]:
        blob = blob_path(config, layer["digest"])
        tool = ["zstd", "-dc"] if layer["compression"] == "zstd" else ["gzip", "-dc"]
        data = subprocess.run([*tool, str(blob)], capture_output=True, check=True).stdout
        subprocess.run(["cpio", "-idmu", "--quiet"], input=data, cwd=dest, check=True)
    return dest


def apply_whiteouts(root: Path) -> list[str]:
    listed = (root / ".provisiond/whiteouts").read_text().split()
    for path in listed:
        target = root / path.lstrip("/")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    return listed


def run_cli(config, *args: str) -> tuple[int, str]:
    """The CLI in-process against the module's state dir: (exit code, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--state-dir", str(config.state_dir), *args])
    return code, out.getvalue() + err.getvalue()


def test_tiny_layers_unpack_into_a_bootable_tree(lab, tmp_path):
    config, manifest = lab["config"], lab["manifest"]
    root = unpack(config, manifest, tmp_path / "root")
    assert [layer["kind"] for layer in manifest["layers"]] == ["busybox", "copy"]
    assert os.access(root / "bin/busybox", os.X_OK)
    assert os.readlink(root / "bin/sh") == "busybox"
    assert os.path.realpath(root / "sbin/init") == str(root / "bin/busybox")
    assert (root / "etc/passwd").read_text().startswith("root:x:0:0:")
    assert "::sysinit:/etc/init.d/rcS" in (root / "etc/inittab").read_text()
    assert (root / "etc/init.d/rcS").stat().st_mode & 0o777 == 0o755
    moddir = root / "lib/modules" / manifest["kernel"]["version"]
    dep = (moddir / "modules.dep").read_text()
    assert "virtio_net.ko: " in dep and "e1000.ko" in dep
    assert len(list(moddir.rglob("*.ko"))) < 20
    assert not list((root / "boot").glob("vmlinuz-*")), "the kernel is its own blob"
    assert (root / ".provisiond/whiteouts").read_text() == ""
    out = subprocess.run([str(root / "bin/busybox"), "echo", "hi"], capture_output=True)
    assert out.stdout == b"hi\n"


def test_tiny_kernel_blob_and_manifest(lab):
    config, manifest = lab["config"], lab["manifest"]
    kernel = blob_path(config, manifest["kernel"]["digest"]).read_bytes()
    assert kernel[0x202:0x206] == b"HdrS"  # a bzImage
    assert manifest["init"] == "/sbin/init" and "console=ttyS0" in manifest["kernel_args"]
    assert load_manifest(config, "tiny") == manifest
    assert manifest["total_size"] < 12 * 2**20
    assert manifest["layers"][0]["size"] < 3 * 2**20
    builds = journal.read_since(config, 0, kinds=frozenset({"build."}))
    assert [(e.kind, e.subject) for e in builds[:2]] == [
        ("build.started", "image/tiny"), ("build.finished", "image/tiny")]
    assert builds[1].data == {"what": "image", "name": "tiny", "layers": len(manifest["layers"]),
                              "size": manifest["total_size"],
                              "seconds": manifest["build_seconds"]}


def test_rebuild_reuses_every_layer_untouched(lab):
    """A rebuild with nothing changed rebuilds no layer and rewrites no blob or cached tree
    (how long it takes is bench/bench_images.py's business)."""
    config = lab["config"]
    before = _stamps(config, lab["manifest"])
    events: list[dict] = []
    again = build_image(config, "tiny", progress=events.append)
    assert [e["status"] for e in events] == ["cached", "cached"]
    assert [l["digest"] for l in again["layers"]] == [
        l["digest"] for l in lab["manifest"]["layers"]]
    assert _stamps(config, again) == before


def _stamps(config, manifest: dict) -> dict[Path, tuple[int, int]]:
    """(inode, mtime) of each layer's blob and cached tree: a rewrite changes them."""
    paths = [blob_path(config, layer["digest"]) for layer in manifest["layers"]]
    paths += [config.state_dir / "cache/layers" / layer["key"] for layer in manifest["layers"]]
    return {path: (path.stat().st_ino, path.stat().st_mtime_ns)
            for path in paths if path.exists()}


def test_top_layer_change_rebuilds_only_that_layer(lab):
    folder = lab["recipes"] / "tiny-changed"
    shutil.copytree(SHIPPED_DIR / "images/tiny", folder)
    with open(folder / "files/rcS", "a") as handle:
        handle.write("echo changed\n")
    events: list[dict] = []
    changed = build_image(lab["config"], "tiny-changed", progress=events.append)
    assert [e["status"] for e in events] == ["cached", "building", "built"]
    old, new = lab["manifest"]["layers"], changed["layers"]
    assert new[0]["digest"] == old[0]["digest"]
    assert new[1]["digest"] != old[1]["digest"]
    assert changed["kernel"] == lab["manifest"]["kernel"]


def test_two_builds_give_identical_digests(lab, tmp_path):
    """The first build unpacked the kernel .deb; this one reuses the kept module selection:
    both paths must give the same bytes."""
    write_default_config(tmp_path / "fresh")
    fresh = build_image(load_config(tmp_path / "fresh"), "tiny")
    assert [l["digest"] for l in fresh["layers"]] == [
        l["digest"] for l in lab["manifest"]["layers"]]
    assert fresh["kernel"]["digest"] == lab["manifest"]["kernel"]["digest"]


def test_deletions_become_the_final_images_whiteouts(lab, tmp_path):
    add_recipe(lab, "whiteouts", {"init": "/sbin/init", "layers": [
        {"kind": "image", "name": "tiny"},
        {"kind": "run", "commands": ["rm /etc/hostname /etc/hosts",
                                     "rm -r /usr/share/udhcpc"]},
        {"kind": "run", "commands": ["echo again > /etc/hosts",
                                     "mkdir /usr/share/udhcpc",
                                     "echo new > /usr/share/udhcpc/new"]},
    ]})
    manifest = build_image(lab["config"], "whiteouts")
    assert len(manifest["layers"]) == 4
    root = unpack(lab["config"], manifest, tmp_path / "root")
    listed = apply_whiteouts(root)
    assert listed == ["/etc/hostname", "/usr/share/udhcpc/default.script"]
    assert (root / "etc/hosts").read_text() == "again\n"
    assert (root / "usr/share/udhcpc/new").read_text() == "new\n"
    assert not (root / "etc/hostname").exists()
    middle = unpack(lab["config"], {"layers": manifest["layers"][:3]}, tmp_path / "middle")
    assert (middle / ".provisiond/whiteouts").read_text().split() == [
        "/etc/hostname", "/etc/hosts", "/usr/share/udhcpc"]


def unpack_layer(config, layer: dict, dest: Path) -> Path:
    """One layer's blob alone, unpacked with the real cpio tool."""
    return unpack(config, {"layers": [layer]}, dest)


def test_a_directory_replaced_by_a_link_or_file_is_packed_beside_its_layer(lab, tmp_path):
    """The kernel cannot put a link or file over a directory with files (the node's side:
    test_mounted_layers_boot.py): the layer that does carries it again under
    .provisiond/replacements.d/<depth>/, and each image's top layer lists those its
    final tree shows, for a layer shared by images that differ above it."""
    add_recipe(lab, "replaced", {"layers": [
        {"kind": "image", "name": "tiny"},
        {"kind": "run", "commands": ["mkdir -p /opt/link /opt/file",
                                     "echo a > /opt/link/a && echo a > /opt/file/a"]},
        {"kind": "run", "commands": ["rm -rf /opt/link && ln -s /srv/x /opt/link",
                                     "rm -rf /opt/file && echo file > /opt/file"]}]})
    add_recipe(lab, "replaced-back", {"layers": [
        {"kind": "image", "name": "replaced"},
        {"kind": "run", "commands": ["rm /opt/link && mkdir /opt/link",
                                     "echo new > /opt/link/new"]}]})
    config = lab["config"]
    replaced, back = build_image(config, "replaced"), build_image(config, "replaced-back")
    assert back["layers"][:4] == replaced["layers"]
    lower = unpack_layer(config, replaced["layers"][2], tmp_path / "lower")
    assert not (lower / ".provisiond/replacements").exists()  # layers packed as before
    top = unpack_layer(config, replaced["layers"][3], tmp_path / "top")
    assert (top / ".provisiond/replacements").read_text() == "003/opt/file\n003/opt/link\n"
    assert os.readlink(top / ".provisiond/replacements.d/003/opt/link") == "/srv/x"
    assert (top / ".provisiond/replacements.d/003/opt/file").read_text() == "file\n"
    assert (top / ".provisiond/whiteouts").read_text() == "/opt/file/a\n/opt/link/a\n"
    above = unpack_layer(config, back["layers"][4], tmp_path / "above")
    assert (above / ".provisiond/replacements").read_text() == "003/opt/file\n"
    assert (above / ".provisiond/whiteouts").read_text() == "/opt/file/a\n/opt/link/a\n"
    assert not (above / ".provisiond/replacements.d").exists()
    fresh = tmp_path / "fresh"
    write_default_config(fresh)
    (fresh / "provisiond.yaml").write_text(yaml.safe_dump({"image_dirs": [str(lab["recipes"])]}))
    again = build_image(load_config(fresh), "replaced-back")
    assert [l["digest"] for l in again["layers"]] == [l["digest"] for l in back["layers"]]


BAD_RECIPES = {
    "unknown kind": ({"kind": "frobnicate"}, "layer 2: unknown kind 'frobnicate'"),
    "missing file": ({"kind": "copy", "files": [{"src": "files/nope", "dest": "/x"}]},
                     "layer 2 (copy): missing file files/nope"),
    "failing command": ({"kind": "run", "commands": ["echo boom >&2; exit 3"]},
                        "layer 2 (run): command 'echo boom >&2; exit 3' exited 3: boom"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECIPES))
def test_bad_recipe_fails_in_one_line_and_keeps_the_previous_image(lab, case):
    good = {"layers": [{"kind": "image", "name": "tiny"},
                       {"kind": "run", "commands": ["echo ok > /ok"]}]}
    name = "bad-" + case.replace(" ", "-")
    add_recipe(lab, name, good)
    before = build_image(lab["config"], name)
    entry, message = BAD_RECIPES[case]
    add_recipe(lab, name, {"layers": [good["layers"][0], entry]})
    code, output = run_cli(lab["config"], "image", "build", name)
    lines = [l for l in output.splitlines() if l.startswith("provisiond: error")]
    assert code != 0 and len(lines) == 1, output
    assert f"recipe {name}" in lines[0] and message in lines[0], lines[0]
    assert "Traceback" not in output
    assert load_manifest(lab["config"], name) == before
    last = journal.read_since(lab["config"], 0, kinds=frozenset({"build."}))[-1]
    assert (last.kind, last.subject) == ("build.failed", f"image/{name}")
    assert message in last.data["message"]


def test_concurrent_builds_of_one_image_are_serialized(lab):
    add_recipe(lab, "slow", {"layers": [
        {"kind": "image", "name": "tiny"},
        {"kind": "run", "commands": ["sleep 1; date > /built-at"]}]})
    argv = [sys.executable, "-m", "provisiond", "--state-dir", str(lab["config"].state_dir),
            "image", "build", "slow"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=REPO) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    tops = sorted(next(l for l in o.splitlines() if l.startswith("[3/3]") and "..." in l
                       and "building" not in l) for o in outputs)
    assert "built" in tops[0] and "cached" in tops[1], tops


def test_cli_list_show_delete_and_gc(lab, tmp_path):
    config = lab["config"]
    add_recipe(lab, "doomed", {"layers": [{"kind": "image", "name": "tiny"},
                                          {"kind": "run", "commands": ["echo x > /doomed"]}]})
    manifest = build_image(config, "doomed")
    code, out = run_cli(config, "image", "list")
    assert code == 0 and "doomed" in out and "tiny" in out
    code, out = run_cli(config, "image", "show", "doomed", "--json")
    assert code == 0 and json.loads(out)["layers"] == manifest["layers"]
    assert run_cli(config, "node", "add", "n001", "--image", "doomed")[0] == 0
    code, out = run_cli(config, "image", "delete", "doomed")
    assert code != 0 and "used by 1 node(s): n001" in out
    code, out = run_cli(config, "image", "delete", "doomed", "--force")
    assert code == 0
    top = blob_path(config, manifest["layers"][-1]["digest"])
    tree = config.state_dir / "cache/layers" / manifest["layers"][-1]["key"]
    assert tree.is_dir()
    code, out = run_cli(config, "image", "gc")
    assert code == 0 and not top.exists() and not tree.exists()
    assert blob_path(config, lab["manifest"]["layers"][0]["digest"]).exists()
    code, out = run_cli(config, "image", "show", "doomed")
    assert code == 3 and "no image named 'doomed'" in out


def test_run_commands_see_the_layers_mtime_clamp_as_source_date_epoch(lab, tmp_path):
    """Tools that honour SOURCE_DATE_EPOCH (shadow's useradd) write it, not today."""
    add_recipe(lab, "epoch", {"layers": [
        {"kind": "image", "name": "tiny"},
        {"kind": "run", "commands": ['echo "$SOURCE_DATE_EPOCH" > /epoch']}]})
    root = unpack(lab["config"], build_image(lab["config"], "epoch"), tmp_path / "root")
    assert (root / "epoch").read_text() == f"{MTIME_CLAMP}\n"
