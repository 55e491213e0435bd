"""Mounted layers' own logic: which blobs a node loads and how it boots, the boot kit's
module order, the manifest section, and the packers' deterministic, kernel-free images."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from provisiond.errors import BuildFailed
from provisiond.images import squash
from tests.tools import tool

LAYERS = [{"digest": "sha256:" + "a" * 64}, {"digest": "sha256:" + "b" * 64}]
MOUNTED = {"boot": "mounted", "format": "squashfs",
           "layers": [{"digest": "sha256:" + "c" * 64, "size": 1, "file": "x"},
                      {"digest": "sha256:" + "d" * 64, "size": 1, "file": "y"}],
           "kit": {"digest": "sha256:" + "e" * 64, "size": 1, "modules": ["loop"]}}


def manifest(**mounted) -> dict:
    return {"layers": LAYERS, "kernel_args": [], "mounted": {**MOUNTED, **mounted}}


def test_a_node_boots_as_its_image_says_unless_its_kernel_args_say_otherwise():
    assert squash.boot_mode(manifest(), []) == "mounted"
    assert squash.boot_mode(manifest(boot="unpacked"), []) == "unpacked"
    assert squash.boot_mode(manifest(boot="unpacked"), ["provisiond.boot=mounted"]) == "mounted"
    assert squash.boot_mode(manifest(), ["provisiond.boot=unpacked", "quiet"]) == "unpacked"
    assert squash.boot_mode(manifest(), ["provisiond.boot=bogus"]) == "mounted"
    image_says = {**manifest(), "kernel_args": ["provisiond.boot=unpacked"]}
    assert squash.boot_mode(image_says, []) == "unpacked"
    assert squash.boot_mode(image_says, ["provisiond.boot=mounted"]) == "mounted"


def test_an_image_without_a_possible_mounted_boot_boots_unpacked():
    assert squash.boot_mode({"layers": LAYERS}, ["provisiond.boot=mounted"]) == "unpacked"
    broken = manifest(unavailable="the kernel has no module squashfs")
    assert squash.boot_mode(broken, ["provisiond.boot=mounted"]) == "unpacked"


def test_a_mounted_boot_loads_the_kit_then_the_layer_images_in_order():
    assert squash.layer_blobs(manifest(), "unpacked") == [l["digest"] for l in LAYERS]
    assert squash.layer_blobs(manifest(), "mounted") == [
        "sha256:" + "e" * 64, "sha256:" + "c" * 64, "sha256:" + "d" * 64]


def test_modules_load_after_their_dependencies():
    chosen = {"overlay": [], "squashfs": ["zstd_x"], "zstd_x": [], "loop": []}
    order = squash._load_order(chosen)
    assert order.index("zstd_x") < order.index("squashfs") and sorted(order) == sorted(chosen)


def test_a_kernel_without_the_modules_makes_the_image_boot_unpacked(tmp_path):
    (tmp_path / "lib/modules/6.1.0-x").mkdir(parents=True)
    kit = squash.boot_kit(None, tmp_path, "6.1.0-x")
    assert kit == {"missing": ["loop", "squashfs", "overlay"]}
    section = squash.mounted_section([{"mounted": {"format": "squashfs", "digest": "d",
                                                   "size": 1, "file": "f"}}], kit, "mounted")
    assert section["boot"] == "unpacked" and "squashfs" in section["unavailable"]


def test_an_unknown_format_is_one_clear_error(tmp_path):
    with pytest.raises(BuildFailed, match="unknown mounted layer format 'ext4'"):
        squash.pack_command("ext4", tmp_path, tmp_path / "out")


@pytest.mark.skipif(os.geteuid() != 0 or not tool("mksquashfs") or not tool("mkfs.erofs"),
                    reason="needs root (mknod), squashfs-tools and erofs-utils")
@pytest.mark.parametrize("fs", sorted(squash.FORMATS))
def test_packed_images_are_deterministic_and_leave_kernels_out(tmp_path, fs):
    tree = tmp_path / "tree"
    (tree / "boot").mkdir(parents=True)
    (tree / "boot/vmlinuz-6.1").write_text("kernel")
    (tree / "boot/config-6.1").write_text("config")
    os.mknod(tree / "gone", 0o20644, os.makedev(0, 0))  # an overlayfs whiteout
    digests = set()
    for run in range(2):
        out = tmp_path / f"{run}.{fs}"
        squash.pack_image(fs, tree, out)
        digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
        newer = squash.source_date_epoch() + 1000 * (run + 1)  # clamped: does not count
        os.utime(tree / "boot/config-6.1", (newer, newer))
    assert len(digests) == 1
    data = out.read_bytes()
    assert b"config-6.1" in data and b"vmlinuz-6.1" not in data and b"gone" in data


@pytest.mark.skipif(not tool("mksquashfs") or not tool("unsquashfs"),
                    reason="needs squashfs-tools")
def test_squashfs_layers_clamp_mtimes_as_the_cpio_layers_do(tmp_path):
    """Older mtimes stay (a package's .py keeps the mtime its .pyc was compiled against,
    as in an unpacked boot), newer ones become the clamp."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "old.py").write_text("old")
    (tree / "new").write_text("new")
    os.utime(tree / "old.py", (1588636800, 1588636800))  # 2020-05-05
    os.utime(tree / "new", (squash.source_date_epoch() + 86400,) * 2)
    squash.pack_image("squashfs", tree, tmp_path / "layer.squashfs")
    out = tmp_path / "out"
    subprocess.run([tool("unsquashfs"), "-q", "-n", "-d", str(out),
                    str(tmp_path / "layer.squashfs")], check=True, capture_output=True)
    assert (out / "old.py").stat().st_mtime == 1588636800
    assert (out / "new").stat().st_mtime == squash.source_date_epoch()


@pytest.mark.skipif(not tool("mksquashfs"), reason="needs squashfs-tools")
def test_a_layer_packed_by_an_older_packer_is_packed_again(tmp_path):
    """A mounted form's record names the packing it had: one made before a change of how
    layers are packed (e.g. times set, not clamped) is not served again."""
    from provisiond.config import load_config, write_default_config

    write_default_config(tmp_path / "state")
    config = load_config(tmp_path / "state")
    layers = tmp_path / "layers"
    (layers / "k0").mkdir(parents=True)
    (layers / "k0" / "file").write_text("x")
    records = [{"key": "k0"}]
    squash.add_mounted(config, layers, records)
    first = records[0]["mounted"]
    squash.add_mounted(config, layers, records)
    assert records[0]["mounted"] == first  # same packing: kept
    old = {k: v for k, v in first.items() if k != "packing"}
    records = [{"key": "k0", "mounted": {**old, "digest": "sha256:" + "0" * 64}}]
    (config.blob_dir / ("0" * 64)).write_bytes(b"packed with -all-time")
    squash.add_mounted(config, layers, records)
    assert records[0]["mounted"] == first


@pytest.mark.skipif(not tool("mksquashfs"), reason="needs squashfs-tools")
def test_a_layer_image_too_big_for_a_boot_makes_the_image_boot_unpacked(tmp_path,
                                                                        monkeypatch):
    """A newc entry holds less than 4 GiB (monkeypatched small here): such a layer's image
    cannot reach a node, so the image boots unpacked, saying why, instead of its build
    failing (as it did even for `boot: unpacked`); the verdict is kept, not repacked."""
    from provisiond.config import load_config, write_default_config

    write_default_config(tmp_path / "state")
    config = load_config(tmp_path / "state")
    layers = tmp_path / "layers"
    for key, size in (("k0", 10), ("k1", 20000)):
        (layers / key).mkdir(parents=True)
        (layers / key / "file").write_bytes(os.urandom(size))
    monkeypatch.setattr(squash, "NEWC_MAX_FILE", 10000)
    records = [{"key": "k0"}, {"key": "k1"}]
    squash.add_mounted(config, layers, records)
    kit = {"digest": "sha256:" + "e" * 64, "size": 1, "modules": [], "format": "squashfs"}
    section = squash.mounted_section(records, kit, "mounted")
    assert section["boot"] == "unpacked" and section["layers"] == []
    assert "layer 2" in section["unavailable"] and "4 GiB" in section["unavailable"]
    manifest = {"layers": LAYERS, "mounted": section}
    assert squash.boot_mode(manifest, ["provisiond.boot=mounted"]) == "unpacked"
    assert "unpacked (mounted unavailable: " in squash.describe_boot(manifest)
    (layers / "k1.json").unlink()
    squash.add_mounted(config, layers, records)
    assert not (layers / "k1.json").exists()  # nothing packed again


@pytest.mark.skipif(not tool("bwrap") or not tool("busybox"), reason="needs bwrap, busybox")
@pytest.mark.parametrize("with_init", [False, True])
def test_the_kits_init_says_what_is_missing_instead_of_ending_pid_1(tmp_path, with_init):
    """Without the init overlay's /init the kit's wrapper stopped at once (pid 1 ending: a
    kernel panic with no word of why); now it says so and starts a shell."""
    root = tmp_path / "root"
    kit = root / squash.KIT_BIN
    kit.mkdir(parents=True)
    (kit / "busybox").write_bytes(open(tool("busybox"), "rb").read())
    (kit / "busybox").chmod(0o755)
    for applet in squash.APPLETS:
        (kit / applet).symlink_to("busybox")
    (root / squash.RDINIT.lstrip("/")).write_text(squash.WRAPPER)
    (root / squash.RDINIT.lstrip("/")).chmod(0o755)
    if with_init:
        (root / "init").write_text('echo "init ran with $*"\n')
    proc = subprocess.run([tool("bwrap"), "--bind", str(root), "/", "--dev", "/dev",
                           squash.RDINIT, "quiet"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    if with_init:
        assert proc.stdout == "init ran with quiet\n"
    else:
        assert "no /init" in proc.stdout and "init system overlay" in proc.stdout
        assert "starting a shell" in proc.stdout and proc.returncode == 0


@pytest.mark.skipif(not tool("mksquashfs") or not tool("mkfs.erofs"),
                    reason="needs squashfs-tools and erofs-utils")
@pytest.mark.parametrize("fs", sorted(squash.FORMATS))
def test_layers_pack_with_source_date_epoch_set(tmp_path, monkeypatch, fs):
    """A reproducible build sets SOURCE_DATE_EPOCH: mksquashfs refused it beside -all-time
    ('can't be used at the same time'), so every such build failed."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "file").write_text("x")
    squash.pack_image(fs, tmp_path / "tree", tmp_path / f"out.{fs}")
    assert (tmp_path / f"out.{fs}").stat().st_size > 0


def block_size(blob) -> int:
    """The block size the superblock of the squashfs image in a mounted layer blob (a
    one-file cpio) records: bytes 12-15 after its magic, little-endian."""
    data = blob.read_bytes()
    start = data.index(b"hsqs")
    return int.from_bytes(data[start + 12:start + 16], "little")


@pytest.mark.skipif(not tool("mksquashfs"), reason="needs squashfs-tools")
@pytest.mark.parametrize("data, block", [(100, 4096), (5000, 8192), (70_000, 131072),
                                         (262_144, 262144), (3_000_000, 262144)])
def test_a_small_layer_packs_with_blocks_no_larger_than_its_data(tmp_path, data, block):
    """Each mount holds caches of one block however small the layer (1.8 MiB per mount
    with 256 KiB blocks, 0.33 MiB with 4 KiB, measured in Debian 12's kernel): every
    layer was packed with 256 KiB blocks, debian12's two tiny ones too."""
    from provisiond.config import load_config, write_default_config

    write_default_config(tmp_path / "state")
    config = load_config(tmp_path / "state")
    tree = tmp_path / "layers" / "k0"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/a").write_bytes(b"a" * (data // 2))
    (tree / "etc/b").write_bytes(b"b" * (data - data // 2))
    (tree / "etc/link").symlink_to("/" + "x" * 4000)  # not file data
    config.blob_dir.mkdir(parents=True)
    digests = set()
    for _ in range(2):
        record = squash.store_mounted(config, tree, 0, "squashfs")
        digests.add(record["digest"])
    assert len(digests) == 1  # deterministic: the same tree, the same block size
    assert block_size(squash.blob_path(config, record["digest"])) == block


def test_a_mounted_boot_asked_but_impossible_says_why():
    unavailable = manifest(boot="unpacked", unavailable="the kernel has no module loop")
    assert squash.mounted_refused(unavailable, ["provisiond.boot=mounted"]) == (
        "boots unpacked, not mounted as provisiond.boot=mounted asks: the kernel has no "
        "module loop")
    assert squash.mounted_refused(unavailable, []) is None  # nobody asked
    assert squash.mounted_refused(unavailable, ["provisiond.boot=mounted",
                                                "provisiond.boot=unpacked"]) is None
    assert squash.mounted_refused(manifest(), ["provisiond.boot=mounted"]) is None
    old = {"layers": LAYERS, "kernel_args": ["provisiond.boot=mounted"]}
    assert "built before mounted layers" in squash.mounted_refused(old, [])


def test_a_mounted_form_without_its_boot_kit_boots_unpacked():
    """A manifest trimmed of its kit (doctor checks for it): the node's script was a
    server error (KeyError listing the kit's blob) and `image show` a traceback."""
    kitless = manifest()
    kitless["mounted"].pop("kit")
    assert squash.boot_mode(kitless, ["provisiond.boot=mounted"]) == "unpacked"
    assert squash.layer_blobs(kitless, squash.boot_mode(kitless, [])) == [
        layer["digest"] for layer in LAYERS]
    assert squash.describe_boot(kitless) == (
        "unpacked (the mounted form has no boot kit: build the image again)")
    assert squash.mounted_refused(kitless, ["provisiond.boot=mounted"]).endswith(
        "its mounted form has no boot kit (rebuild it)")
