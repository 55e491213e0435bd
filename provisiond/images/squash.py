"""Mounted layers: every layer also packed as a compressed read-only file system image that
the node's /init loop-mounts, stacked under overlayfs with a tmpfs upper layer, instead of
unpacking the layer's cpio into RAM.

The image (squashfs by default) is the layer's overlayfs upper dir as it is: whiteouts stay
0/0 character devices and opaque dirs keep their `trusted.overlay.opaque` xattr, so the
stack shows what the build's merged view showed. The blob is a newc cpio holding that one
file as `.provisiond/layers/<depth>.<format>`: the kernel unpacks it into the initramfs as
a file from any loader (Debian 12's iPXE, 1.0.0+git-20190125, wraps a named initrd in a
cpio header only on BIOS, and without parent dirs; on UEFI its files reach the kernel raw).
A layer's depth (its number of parents) is part of its cache key's chain, so the name sorts
the files into layer order. What the node runs before its root exists goes into one more
small blob, the boot kit: busybox, and the kernel modules (loop, the file system, overlay)
from the image's own /lib/modules unless its kernel has them built in.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from provisiond.archive import Writer, dir_entry, file_entry, symlink_entry
from provisiond.atomic import write_atomic
from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.images.blobs import blob_path, file_sha256, open_blob
from provisiond.images.cpio import EPOCH_ENV, source_date_epoch
from provisiond.images.debs import extract_deb, fetch_deb
from provisiond.images.kernel import module_bytes, scan_modules, select_modules
from provisiond.state.layout import Layout

LAYERS_DIR = ".provisiond/layers"
MODULES_DIR = ".provisiond/modules"
KIT_BIN = ".provisiond/bin"
RDINIT = "/.provisiond/bin/init"  # the kernel's rdinit= for a mounted boot
APPLETS = ("sh", "mount", "umount", "mkdir", "cp", "rm", "cat", "insmod", "switch_root",
           "losetup", "ls", "sleep", "find", "dmesg")
WRAPPER = """#!/.provisiond/bin/sh
# provisiond mounted boot: the image is not unpacked, so the init overlay's /init runs with
# the boot kit's busybox
PATH=/.provisiond/bin
export PATH
if [ ! -f /init ]; then  # pid 1 ending would be a kernel panic saying nothing of why
    case "$(dmesg)" in  # the overlays come last: a short unpacking loses them first
        *"Initramfs unpacking failed"*)
            mkdir -p /proc && mount -t proc proc /proc && read -r _ kib _ </proc/meminfo
            echo "provisiond: no /init: the kernel could not unpack all the boot files"
            echo "provisiond: ('Initramfs unpacking failed' above): ${kib:+$((kib / 1024)) MiB of }RAM may be too little for the image's layers, or a boot file is damaged" ;;
        *) echo "provisiond: no /init: the node needs the init system overlay (system_overlays)" ;;
    esac
    echo "provisiond: cannot boot; starting a shell on the console"
    exec sh
fi
exec sh /init "$@"
"""
KERNEL_FILES = r"^boot/(vmlinuz|initrd\.img)-"
# erofs-utils 1.5 and the 6.1 kernel know lz4 only (zstd came to erofs in 6.10)
FORMATS = {
    "squashfs": {"module": "squashfs", "compressor": "zstd", "level": 16, "block": "256K"},
    "erofs": {"module": "erofs", "compressor": "lz4hc"},
}
DEFAULT_FORMAT = "squashfs"
# How layers are packed: a layer's mounted form made by another packing is made again (2:
# file times clamped, no longer all set to the epoch; 3: squashfs zstd-16, 256 KiB blocks;
# 4: a layer with less data packed with smaller blocks, see squashfs_block)
PACKING = 4
# Each squashfs mount holds a data and a fragment cache of one block each and a zstd
# context for a block for as long as it is mounted, however little the layer holds.
# Measured in Debian 12's kernel (6.1, QEMU, MemAvailable after boot, 10 tiny layers more
# against 10 fewer): 1.8 MiB per mount with 256 KiB blocks (1.1 slab, 0.7 vmalloc),
# 0.33 MiB with 4 KiB ones.
MIN_BLOCK = 4096
NEWC_MAX_FILE = 0xFFFFFFFF  # a newc entry's size is 8 hex digits (archive.Writer refuses more)
BOOT_MODES = ("mounted", "unpacked")
DEFAULT_BOOT = "mounted"


def pack_command(fs: str, tree: Path, out: Path, compressor: str | None = None,
                 level: int | None = None, block: str | None = None) -> list[str]:
    """The packer's argv: deterministic (a fixed UUID; times: pack_image), xattrs kept,
    kernels out."""
    if fs not in FORMATS:
        raise BuildFailed(f"unknown mounted layer format {fs!r} (use {', '.join(FORMATS)})")
    if compressor is None:
        compressor, level = FORMATS[fs]["compressor"], FORMATS[fs].get("level")
    if fs == "squashfs":
        tuning = ["-Xcompression-level", str(level)] if level is not None else []
        tuning += ["-b", block or FORMATS[fs]["block"]]
        return ["mksquashfs", str(tree), str(out), "-noappend", "-quiet", "-no-progress",
                "-comp", compressor, *tuning, "-xattrs", "-reproducible", "-processors", "2",
                "-wildcards", "-e", "boot/vmlinuz-*", "boot/initrd.img-*"]
    return ["mkfs.erofs", "--quiet", f"-z{compressor}{f',{level}' if level else ''}",
                "-U00000000-0000-0000-0000-000000000000", f"--exclude-regex={KERNEL_FILES}",
                str(out), str(tree)]


def pack_image(fs: str, tree: Path, out: Path, compressor: str | None = None,
               level: int | None = None, block: str | None = None) -> None:
    """Pack a layer tree into a file system image at `out`; a failure is one line."""
    argv = pack_command(fs, tree, out, compressor, level, block)
    # both packers clamp file times newer than SOURCE_DATE_EPOCH to it and keep older ones,
    # as the cpio layers do (-all-time/-T set every file's: a package's .py then no longer
    # matched the mtime its .pyc was compiled against, and Python recompiled it at boot)
    env = {**os.environ, EPOCH_ENV: str(source_date_epoch())}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              env=env)
    except FileNotFoundError:
        raise BuildFailed(f"{argv[0]} is not installed (Debian: "
                          f"{'squashfs-tools' if fs == 'squashfs' else 'erofs-utils'})") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
        raise BuildFailed(f"{argv[0]} failed: {lines[-1]}")


def squashfs_block(tree: Path) -> str:
    """The block size for a layer: the smallest power of two holding all its file data
    (one block and its fragments then hold the whole layer), from MIN_BLOCK up to the
    format's default. The tree's content sets it, so packs stay deterministic."""
    limit = int(FORMATS["squashfs"]["block"].rstrip("K")) * 1024
    total = 0
    for folder, _dirs, files in os.walk(tree):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(folder, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        if total >= limit:
            return FORMATS["squashfs"]["block"]
    block = MIN_BLOCK
    while block < total:
        block *= 2
    return f"{block // 1024}K"


def layer_file(depth: int, fs: str) -> str:
    return f"{LAYERS_DIR}/{depth:03d}.{fs}"


def store_mounted(config: Config, tree: Path, depth: int, fs: str) -> dict:
    """Pack one layer tree and store it wrapped in a one-file cpio; its blob record, or
    why it has none (an image a newc entry cannot hold: the image's nodes boot unpacked)."""
    record = {"format": fs, "file": layer_file(depth, fs), "packing": PACKING}
    with tempfile.TemporaryDirectory(prefix=".mounted.", dir=Layout.of(config).blobs) as tmp:
        image = Path(tmp) / f"layer.{fs}"
        pack_image(fs, tree, image, block=squashfs_block(tree) if fs == "squashfs" else None)
        size = image.stat().st_size
        if size > NEWC_MAX_FILE:
            return {**record, "unavailable": f"layer {depth + 1}'s {fs} image is "
                    f"{size / 2**30:.1f} GiB (a boot loads less than 4 GiB per file)"}
        os.chmod(image, 0o444)
        with open_blob(config) as blob:
            writer = Writer(blob.hashing, mtime=source_date_epoch())
            for folder in (".provisiond", LAYERS_DIR):
                writer.add(dir_entry(folder))
            writer.add_path(layer_file(depth, fs), image, os.stat(image))
            writer.close()
            digest = blob.commit()
        return {**record, "digest": digest, "size": blob.size}


def add_mounted(config: Config, layers: Path, records: list[dict], fs: str = DEFAULT_FORMAT
                ) -> None:
    """Give each layer record its mounted form (packed now if it has none in `fs` by this
    PACKING or its blob is gone), saved beside the layer's own record."""
    Layout.of(config).blobs.mkdir(parents=True, exist_ok=True)
    for depth, record in enumerate(records):
        if _is_current(config, record.get("mounted") or {}, depth, fs):
            continue
        record["mounted"] = store_mounted(config, layers / record["key"], depth, fs)
        write_atomic(layers / f"{record['key']}.json", json.dumps(record, indent=1) + "\n")


def _is_current(config: Config, mounted: dict, depth: int, fs: str) -> bool:
    """Packed as this build would pack it, and its blob still there (or none possible)."""
    if (mounted.get("format"), mounted.get("file"), mounted.get("packing")) != (
            fs, layer_file(depth, fs), PACKING):
        return False
    return "unavailable" in mounted or blob_path(config, mounted["digest"]).is_file()


def boot_kit(config: Config, root: Path, version: str, fs: str = DEFAULT_FORMAT) -> dict:
    """What a mounted boot runs before the root exists, stored as a cpio blob: busybox
    (Debian's busybox-static) with the applets /init uses, the RDINIT wrapper, and the
    modules (loop, the file system, overlay: those not built in) from the image's own
    /lib/modules/<version>, in load order. Its record, or `{"missing": [...]}` naming what
    the image's kernel has neither built in nor as a module (its nodes then boot unpacked)."""
    wanted = ["loop", FORMATS[fs]["module"], "overlay"]
    moddir = root / "lib/modules" / version
    if not moddir.is_dir():
        return {"missing": wanted}
    index = scan_modules(moddir)
    builtin = set(index["builtin"])
    missing = [m for m in wanted if m not in builtin and m not in index["modules"]]
    if missing:
        return {"missing": missing}
    order = _load_order(select_modules(index, [m for m in wanted if m not in builtin]))
    entries = [dir_entry(d) for d in (".provisiond", KIT_BIN, MODULES_DIR)]
    entries.append(file_entry(f"{KIT_BIN}/busybox", _busybox(config), 0o755))
    entries += [symlink_entry(f"{KIT_BIN}/{applet}", "busybox") for applet in APPLETS]
    entries.append(file_entry(RDINIT.lstrip("/"), WRAPPER.encode(), 0o755))
    for name in order:
        data = module_bytes(moddir / index["modules"][name]["path"])
        entries.append(file_entry(f"{MODULES_DIR}/{name}.ko", data))
    entries.append(file_entry(f"{MODULES_DIR}/order", "".join(f"{n}\n" for n in order)
                              .encode()))
    with open_blob(config) as blob:
        writer = Writer(blob.hashing, mtime=source_date_epoch())
        for entry in entries:
            writer.add(entry)
        writer.close()
        digest = blob.commit()
    return {"digest": digest, "size": blob.size, "modules": order, "format": fs}


def _busybox(config: Config) -> bytes:
    """/bin/busybox of Debian's busybox-static (the .deb the tiny image's base uses too)."""
    deb = fetch_deb(config, "busybox-static")
    with tempfile.TemporaryDirectory(prefix="kit-busybox.") as tmp:
        extract_deb(deb, Path(tmp), keep=lambda name: name in ("bin", "bin/busybox"))
        return (Path(tmp) / "bin/busybox").read_bytes()


def _load_order(chosen: dict[str, list[str]]) -> list[str]:
    """Dependencies before the modules that need them, names sorted otherwise."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for dep in sorted(chosen.get(name, [])):
            if dep in chosen:
                visit(dep)
        order.append(name)

    for name in sorted(chosen):
        visit(name)
    return order


def mounted_section(records: list[dict], kit: dict, boot: str) -> dict:
    """The manifest's `mounted` part: the default boot mode, the format, the layer blobs
    in order and the boot kit, or why nodes of this image boot unpacked."""
    section = {"boot": boot, "format": records[0]["mounted"]["format"] if records else None,
               "layers": [{k: r["mounted"][k] for k in ("digest", "size", "file")}
                          for r in records if "unavailable" not in r["mounted"]]}
    too_big = [r["mounted"]["unavailable"] for r in records if "unavailable" in r["mounted"]]
    if too_big:
        section.update(boot="unpacked", layers=[], unavailable="; ".join(too_big))
    elif "missing" in kit:
        section.update(boot="unpacked", unavailable="the kernel has no module "
                       + ", ".join(kit["missing"]))
    else:
        section["kit"] = kit
    return section


def boot_mode(manifest: dict, args: list[str]) -> str:
    """How a node boots this image: `provisiond.boot=` among the image's kernel args, then
    the node's `args` (the last wins), else the image's setting; unpacked when the build
    found a mounted boot impossible (or made no mounted form: an older manifest)."""
    if not _can_mount(manifest):
        return "unpacked"
    return _asked_mode(manifest, args) or manifest["mounted"].get("boot", DEFAULT_BOOT)


def _can_mount(manifest: dict) -> bool:
    """A mounted form with a boot kit (a manifest trimmed of it by hand named a blob the
    script could not list: the node's script was a server error)."""
    mounted = manifest.get("mounted")
    return bool(mounted) and not mounted.get("unavailable") and "kit" in mounted


def _asked_mode(manifest: dict, args: list[str]) -> str | None:
    """The last `provisiond.boot=` mode among the image's then the node's kernel args."""
    mode = None
    for arg in [*(manifest.get("kernel_args") or []), *args]:
        if arg.startswith("provisiond.boot=") and arg.split("=", 1)[1] in BOOT_MODES:
            mode = arg.split("=", 1)[1]
    return mode


def mounted_refused(manifest: dict, args: list[str]) -> str | None:
    """Why a node whose kernel args ask `provisiond.boot=mounted` boots unpacked (the
    iPXE script echoes it on the console, doctor warns), or None."""
    if _asked_mode(manifest, args) != "mounted" or boot_mode(manifest, args) == "mounted":
        return None
    mounted = manifest.get("mounted")
    why = (mounted.get("unavailable") or "its mounted form has no boot kit (rebuild it)") \
        if mounted else "it was built before mounted layers (rebuild it)"
    return f"boots unpacked, not mounted as provisiond.boot=mounted asks: {why}"


def layer_blobs(manifest: dict, mode: str) -> list[str]:
    """The digests the node's iPXE script loads for its image layers, in order."""
    if mode != "mounted":
        return [layer["digest"] for layer in manifest["layers"]]
    mounted = manifest["mounted"]
    return [mounted["kit"]["digest"]] + [layer["digest"] for layer in mounted["layers"]]


def mounted_args(manifest: dict) -> list[str]:
    """The kernel args of a mounted boot: start in the boot kit, and how many layers /init
    must find (a short initramfs unpacking, too little RAM, would otherwise boot a root
    missing its top layers)."""
    return [f"rdinit={RDINIT}", f"provisiond.layers={len(manifest['mounted']['layers'])}"]


def mounted_layers(config: Config, records: list[dict], version: str,
                   boot: str | None) -> dict:
    """Pack the layers' mounted forms and the boot modules: the manifest's `mounted`."""
    from provisiond.images import chroot  # noqa: PLC0415 (chroot is heavy for the server)
    from provisiond.images.layers import layer_dir

    layers = layer_dir(config)
    add_mounted(config, layers, records)
    # a directory of this build's own: two builds whose images end in the same layer
    # would otherwise mount, unmount and remove one path under each other
    view = Path(tempfile.mkdtemp(prefix=f"view-modules-{records[-1]['key'][:16]}-",
                                 dir=layers))
    with chroot.overlay([layers / r["key"] for r in reversed(records)], None, view / "w",
                        view / "merged") as merged:
        kit = boot_kit(config, merged, version)
    with contextlib.suppress(OSError):
        view.joinpath("merged").rmdir()
        view.rmdir()
    return mounted_section(records, kit, boot or DEFAULT_BOOT)


def describe_boot(manifest: dict) -> str:
    """One line for `image show`: the default boot mode and the mounted form's size."""
    mounted = manifest.get("mounted")
    if not mounted:
        return "unpacked (built before mounted layers)"
    if mounted.get("unavailable"):
        return f"unpacked (mounted unavailable: {mounted['unavailable']})"
    if "kit" not in mounted:
        return "unpacked (the mounted form has no boot kit: build the image again)"
    size = sum(layer["size"] for layer in mounted["layers"]) + mounted["kit"]["size"]
    return (f"{mounted['boot']} (mounted: {mounted['format']}, {size / 2**20:.1f} MiB with "
            f"the boot kit; provisiond.boot=mounted|unpacked per node)")


def mounted_problems(config: Config, manifest: dict) -> list[str]:
    """What would stop a mounted boot of this build from this server: a layer without its
    mounted form, no boot kit, a blob missing or not of the size and digest the manifest
    names (`provisiond doctor`). Empty for a build whose nodes boot unpacked anyway."""
    mounted = manifest.get("mounted")
    if not mounted or mounted.get("unavailable"):
        return []
    layers = mounted.get("layers") or []
    problems = [] if len(layers) == len(manifest["layers"]) else [
        f"{len(layers)} mounted layers for {len(manifest['layers'])} layers"]
    blobs = [(f"layer {depth + 1}", layer) for depth, layer in enumerate(layers)]
    if "kit" in mounted:
        blobs.append(("the boot kit", mounted["kit"]))
    else:
        problems.append("no boot kit")
    for what, record in blobs:
        problem = _blob_problem(config, record)
        if problem:
            problems.append(f"{what}'s blob {problem}")
    return problems


def _blob_problem(config: Config, record: dict) -> str | None:
    """Why a mounted blob cannot be served as its record says, or None."""
    path = blob_path(config, record["digest"])
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name[:12]} is missing"
    if size != record["size"]:
        return f"{path} is {size} bytes, not {record['size']}"
    if "sha256:" + file_sha256(path) != record["digest"]:
        return f"{path} does not match its digest (damaged)"
    return None
