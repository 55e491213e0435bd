"""Mounted layers boot for real, without network: an image on top of tiny that deletes a
file (a whiteout), replaces a directory (an opaque dir), has a symlink an overlay
replaces and a directory symlink (/var/run -> /run) where a site overlay has a directory,
a file deleted by one layer and made again by the next, non-empty directories a later layer
replaces by a symlink or a file (one made a directory again, one inside a directory deleted
in between), and a site overlay whose files the image deletes or hides (a deleted file, a
file in a deleted directory, files under directories replaced by a link or a file, a link
over a directory with files, a file over a symlink, a file under a merged-/usr link), its
kernel blob and initrds as the iPXE script orders them, handed to QEMU (TCG). The mounted
boot must show the same root as the unpacked one, on an overlayfs root stacked from
read-only squashfs layers; both with overlayfs's rule for the overlays: an overlay's entry
hides the image's, unless both are directories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from provisiond.boot.ipxe import kernel_args
from provisiond.config import load_config, write_default_config
from provisiond.images import blob_path, build_image
from provisiond.images.squash import boot_mode, layer_blobs
from provisiond.overlays import ensure_overlay
from tests.tools import command, tool

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.skipif(
    not tool("qemu-system-x86_64") or not tool("mksquashfs"),
    reason="needs qemu-system-x86 and squashfs-tools")]

CHECK = """#!/bin/sh
[ -e /etc/os-release ] && echo "CHECK: os-release present" || echo "CHECK: os-release gone"
[ -e /usr/share/udhcpc/default.script ] && echo "CHECK: old dir content shows" \\
    || echo "CHECK: old dir content gone"
[ -e /usr/share/udhcpc/new ] && echo "CHECK: new dir content shows"
echo "CHECK: link to $(readlink /etc/systemd/system/multi-user.target.wants/systemd-networkd.service)"
echo "CHECK: old mtime $(stat -c %Y /etc/old)"
[ -d /var/run ] && [ ! -L /var/run ] && echo "CHECK: var/run is the overlay's dir: $(ls /var/run)"
echo "CHECK: remade: $(cat /etc/remade)"
[ -e /var/run/old ] && echo "CHECK: var/run old content shows"
echo "CHECK: opt/link -> $(readlink /opt/link)"
[ -f /opt/file ] && echo "CHECK: opt/file is a file: $(cat /opt/file) $(stat -c %a /opt/file)"
[ -d /opt/back ] && [ ! -L /opt/back ] && echo "CHECK: opt/back is a dir:" $(ls /opt/back)
echo "CHECK: opt/gone holds" $(ls /opt/gone) "-> $(readlink /opt/gone/inner)"
[ -e /.provisiond/replacements.d ] && echo "CHECK: side copies stay:" $(find /.provisiond/replacements.d)
echo "CHECK: ovl-deleted: $(cat /etc/ovl-deleted)"
echo "CHECK: ovl-dir holds" $(ls -A /opt/ovl-dir)
[ -d /opt/ovl-link ] && [ ! -L /opt/ovl-link ] && echo "CHECK: ovl-link is a dir:" \
    $(ls -A /opt/ovl-link) "$(cat /opt/ovl-link/old)"
[ -d /opt/ovl-file ] && echo "CHECK: ovl-file is a dir:" $(find /opt/ovl-file)
echo "CHECK: ovl-over-dir -> $(readlink /opt/ovl-over-dir)"
[ -f /etc/ovl-over-link ] && [ ! -L /etc/ovl-over-link ] && echo "CHECK: ovl-over-link is" \
    "a file: $(cat /etc/ovl-over-link), its old target: $(cat /opt/ovl-target)"
[ -L /lib64 ] && echo "CHECK: lib64 -> $(readlink /lib64):" $(ls /usr/lib64)
[ -L /libx32 ] && echo "CHECK: libx32 -> $(readlink /libx32):" $(ls /usr/libx32)
[ -e /.provisiond/overlays ] && echo "CHECK: overlay copies stay"
echo "CHECK: root is $(grep ' / ' /proc/mounts | tail -n 1 | cut -d' ' -f3)"
grep -q provisiond.boot /proc/cmdline || echo "CHECK: no boot arg"
echo "CHECK: done"
"""
ENDS = (b"CHECK: done", b"starting a shell on the console")  # booted, or /init gave up
# the network overlay ships this link too: an overlay file must replace the image's
WANTS = "/etc/systemd/system/multi-user.target.wants"
RECIPE = {"description": "tiny with a whiteout and an opaque dir", "kernel_args":
          ["console=ttyS0"], "layers": [
              {"kind": "image", "name": "tiny"},
              {"kind": "run", "commands": [  # non-empty directories the next layers replace
                  "mkdir -p /opt/link /opt/file /opt/back/sub /opt/gone/inner",
                  "for d in var/run opt/link opt/file opt/back/sub opt/gone/inner; do "
                  "echo old > /$d/old; done",
                  # where the site overlay "upper" has files
                  "echo image > /etc/ovl-deleted",
                  "mkdir -p /opt/ovl-dir /opt/ovl-link /opt/ovl-file/sub /opt/ovl-over-dir",
                  "for d in opt/ovl-dir opt/ovl-link opt/ovl-file/sub opt/ovl-over-dir; do "
                  "echo old > /$d/old; done",
                  "echo target > /opt/ovl-target && ln -s /opt/ovl-target /etc/ovl-over-link",
                  "mkdir -p /usr/lib64 && : > /usr/lib64/image-file && ln -s usr/lib64 /lib64",
                  "mkdir -p /usr/libx32 && ln -s /usr/libx32 /libx32"]},
              {"kind": "run", "commands": [
                  "rm -rf /opt/link && ln -s /srv/x /opt/link",
                  "rm -rf /opt/file && echo file > /opt/file && chmod 640 /opt/file",
                  "rm -rf /opt/back && ln -s /srv/back /opt/back",
                  "rm -rf /opt/gone",
                  "rm /etc/ovl-deleted", "rm -rf /opt/ovl-dir",
                  "rm -rf /opt/ovl-link && ln -s /srv/x /opt/ovl-link",
                  "rm -rf /opt/ovl-file && echo file > /opt/ovl-file"]},
              {"kind": "run", "commands": [
                  "rm /opt/back && mkdir /opt/back && echo new > /opt/back/new",
                  "mkdir /opt/gone && ln -s /srv/inner /opt/gone/inner"]},
              {"kind": "run", "commands": [
                  "rm /etc/os-release",
                  "touch -t 202005050000 /etc/old",  # older than the clamp: kept
                  "rm -rf /usr/share/udhcpc && mkdir /usr/share/udhcpc && : > "
                  "/usr/share/udhcpc/new",
                  f"mkdir -p {WANTS} && ln -s /old/target {WANTS}/systemd-networkd.service",
                  "rm -rf /var/run && ln -s /run /var/run",
                  "echo old > /etc/remade"]},
              {"kind": "run", "commands": ["rm /etc/remade"]},
              {"kind": "run", "commands": ["echo new > /etc/remade"]},
              {"kind": "copy", "files": [{"src": "check", "dest": "/etc/init.d/S10check",
                                          "mode": "0755"}]}]}

# the site overlay "upper": files where the image deletes or replaces (and a link, made there)
UPPER = {"etc/ovl-deleted": "from the overlay\n", "opt/ovl-dir/cfg": "",
         "opt/ovl-link/old": "from the overlay\n", "opt/ovl-file/sub/cfg": "",
         "etc/ovl-over-link": "from the overlay\n", "lib64/ovl-file": "",
         "libx32/sub/ovl-file": ""}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    os.environ.setdefault("PROVISIOND_CACHE_DIR", "/var/tmp/provisiond-test-cache")
    state = tmp_path_factory.mktemp("mounted") / "state"
    write_default_config(state)
    folder = state / "recipes" / "tinywh"
    folder.mkdir(parents=True)
    (folder / "image.yaml").write_text(yaml.safe_dump(RECIPE))
    (folder / "check").write_text(CHECK)
    site = state / "overlays" / "varrun" / "var" / "run"
    site.mkdir(parents=True)
    (site / "marker").write_text("from the overlay\n")
    upper = state / "overlays" / "upper"
    for rel, text in UPPER.items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_text(text)
    (upper / "opt/ovl-over-dir").symlink_to("/srv/y")
    node = {"image": "tinywh", "system_overlays": ["init", "network", "varrun", "upper"],
            "netdevs": {"eth0": {"mac": "52:54:00:00:00:01"}}}
    (state / "inventory.yaml").write_text(yaml.safe_dump({"nodes": {"n001": node}}))
    config = load_config(state)
    return config, build_image(config, "tinywh")


def boot(config, manifest: dict, mode: str, log: Path, edit=lambda parts: parts) -> str:
    """Kernel + initrds as node_script lists them for `mode` (`edit` may change the list
    of their contents), the kernel args it sets."""
    parts = [blob_path(config, d) for d in layer_blobs(manifest, mode)]
    parts += [ensure_overlay(config, "n001", kind) for kind in ("shared", "system")]
    initrd = log.with_suffix(".initrd")
    initrd.write_bytes(b"".join(edit([p.read_bytes() for p in parts])))
    args = [a for a in kernel_args(config, manifest, "n001", None, [], mode)
            if a.startswith(("console=", "rdinit=", "provisiond.layers="))]
    argv = command(["qemu-system-x86_64", "-accel", "tcg", "-m", "256", "-nographic",
                    "-no-reboot", "-nic", "none", "-kernel",
                    str(blob_path(config, manifest["kernel"]["digest"])), "-initrd",
                    str(initrd), "-append", " ".join([*args, "panic=-1"])])
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            deadline = 240
            while deadline > 0 and not any(mark in log.read_bytes() for mark in ENDS):
                try:
                    proc.wait(timeout=2)
                    break
                except subprocess.TimeoutExpired:
                    deadline -= 2
        finally:
            proc.kill()
            proc.wait()
    return log.read_text(errors="replace")


def test_manifest_has_the_mounted_form_of_every_layer(built):
    config, manifest = built
    mounted = manifest["mounted"]
    assert mounted["format"] == "squashfs" and "unavailable" not in mounted
    assert [l["file"] for l in mounted["layers"]] == [
        f".provisiond/layers/{i:03d}.squashfs" for i in range(len(manifest["layers"]))]
    assert boot_mode(manifest, []) == mounted["boot"]
    assert boot_mode(manifest, ["provisiond.boot=unpacked"]) == "unpacked"
    assert set(mounted["kit"]["modules"]) == {"loop", "squashfs", "overlay"}
    for digest in layer_blobs(manifest, "mounted"):
        assert blob_path(config, digest).is_file()


@pytest.mark.parametrize("mode", ["mounted", "unpacked"])
def test_both_boots_show_the_same_root(built, tmp_path, mode):
    config, manifest = built
    log = boot(config, manifest, mode, tmp_path / f"{mode}.log")
    assert "CHECK: done" in log, log[-3000:]
    assert "CHECK: os-release gone" in log, log[-3000:]  # the layer's whiteout
    assert "CHECK: old dir content gone" in log  # the opaque dir
    assert "CHECK: new dir content shows" in log
    assert "CHECK: link to /lib/systemd/system/systemd-networkd.service" in log
    assert "CHECK: old mtime 1588636800" in log  # not the clamp (as -all-time made it)
    # the unpacked boot's kernel replaces the image's symlink by the overlay's directory;
    # the mounted boot's cp stopped there ("target '/.provisiond-root/var/run' is not a
    # directory") and the node got a shell instead of its init
    assert "CHECK: var/run is the overlay's dir: marker" in log, log[-3000:]
    assert "CHECK: remade: new" in log
    # directories with files a later layer replaces: the kernel's unpacking cannot put a
    # link or file over them (its rmdir fails), the unpacked boot ended with empty dirs
    assert "CHECK: opt/link -> /srv/x" in log, log[-3000:]
    assert "CHECK: opt/file is a file: file 640" in log
    assert "CHECK: opt/back is a dir: new" in log  # a link again replaced by a dir
    assert "CHECK: opt/gone holds inner -> /srv/inner" in log  # in a dir deleted between
    assert "CHECK: var/run old content shows" not in log  # the overlay's dir wins whole
    # the layers' side copies, moved in or not (a later layer's won, an overlay's directory
    # stayed), are no part of the image: they held RAM (a file the kernel did put in place
    # over an empty directory twice)
    assert "CHECK: side copies stay" not in log, log[-3000:]
    # the overlays' entries win as in overlayfs: the unpacked boot's whiteouts deleted the
    # overlay's files with the image's (the kernel had unpacked them into one tree)
    assert "CHECK: ovl-deleted: from the overlay" in log, log[-3000:]
    assert "CHECK: ovl-dir holds cfg\n" in log.replace("\r", "")
    assert "CHECK: ovl-link is a dir: old from the overlay" in log
    assert "CHECK: ovl-file is a dir: /opt/ovl-file /opt/ovl-file/sub " \
        "/opt/ovl-file/sub/cfg\n" in log.replace("\r", "")
    # an overlay's link over a directory with files: the mounted boot's cp stopped there
    # ("cannot overwrite directory"), the unpacked boot's kernel could not replace it
    assert "CHECK: ovl-over-dir -> /srv/y" in log
    # a file over the image's symlink: the mounted boot's cp wrote it through the link
    assert "CHECK: ovl-over-link is a file: from the overlay, its old target: target" in log
    # a merged-/usr link stays: the overlay's lib64 files go where it leads (in the root
    # being made, an absolute link too)
    assert "CHECK: lib64 -> usr/lib64: image-file ovl-file" in log
    assert "CHECK: libx32 -> /usr/libx32: sub" in log
    assert "CHECK: overlay copies stay" not in log
    count = len(manifest["layers"])
    if mode == "mounted":
        assert f"provisiond-init: mounted {count} layers read-only" in log, log[-3000:]
        assert "CHECK: root is overlay" in log
    else:
        assert "provisiond-init: building the root file system in tmpfs" in log
        assert "CHECK: root is tmpfs" in log


def test_a_layer_missing_stops_the_boot(built, tmp_path):
    """A layer file the kernel did not get: /init mounted the others and switched root
    into an image without that layer's files, saying nothing."""
    config, manifest = built
    log = boot(config, manifest, "mounted", tmp_path / "short.log",
               lambda parts: parts[:2] + parts[3:])  # the kit, layer 1, then layer 3 on
    count = len(manifest["layers"])
    assert f"ERROR: the image has {count} layers, the kernel unpacked {count - 1}" in log, \
        log[-3000:]
    assert "CHECK: done" not in log


def test_a_short_unpacking_says_so(built, tmp_path):
    """What a node with too little RAM for its layers sees: the kernel stops unpacking
    ("Initramfs unpacking failed"), so the overlays, sent last, are missing; the kit's
    wrapper said the node lacks the init overlay. Junk after the layers stops the unpacking
    as a full RAM does (a RAM size that fails exactly there depends on the kernel)."""
    config, manifest = built
    log = boot(config, manifest, "mounted", tmp_path / "junk.log",
               lambda parts: [*parts[:-2], b"\x01junk" * 1024, *parts[-2:]])
    assert "Initramfs unpacking failed" in log, log[-3000:]
    assert "provisiond: no /init: the kernel could not unpack all the boot files" in log, \
        log[-3000:]
    assert "MiB of RAM may be too little for the image's layers" in log
    assert "needs the init system overlay" not in log
