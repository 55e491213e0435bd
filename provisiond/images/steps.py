"""What each layer kind does to its root, and the inputs (besides its recipe entry) that go
into its cache key."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.images import busybox, chroot
from provisiond.images.blobs import file_sha256
from provisiond.images.cpio import EPOCH_ENV, source_date_epoch
from provisiond.images.debs import apt_mirror, run_tool
from provisiond.images.recipe import Step

TRIM = ["var/lib/apt/lists", "var/cache/apt", "var/cache/debconf/templates.dat-old",
        "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/log"]
CLEANUP = ("rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb "
           "/usr/share/doc/* /usr/share/man/* /usr/share/info/* /var/log/apt /var/log/dpkg.log "
           "/etc/ssh/ssh_host_*_key* /var/cache/ldconfig/aux-cache && : > /etc/machine-id")

# Layers made by package tools: their logs, caches and per-machine files differ between two
# builds of the same packages (alternatives.log holds the time of each change), so they are
# dropped from the layer before it is packed (docs/reproducible-images.md).
TIDIED = frozenset({"debootstrap", "packages", "run"})
VOLATILE_FILES = ("var/cache/ldconfig/aux-cache", "var/lib/dbus/machine-id",
                  "var/lib/systemd/random-seed", "var/cache/apt/pkgcache.bin",
                  "var/cache/apt/srcpkgcache.bin", "var/cache/debconf/config.dat-old",
                  "var/cache/debconf/templates.dat-old", "var/lib/dpkg/status-old",
                  "var/lib/dpkg/diversions-old", "var/lib/dpkg/statoverride-old")
VOLATILE_TREES = ("var/log", "var/lib/apt/lists", "var/cache/apt/archives")


def step_inputs(config: Config, step: Step) -> dict:
    """Inputs other than the entry itself: file contents, package hashes, the mirror
    (oci-archive layers are keyed by their digests in provisiond.images.oci). Layers
    that drop_volatile tidies say so, so none built before it is reused."""
    layer = step.layer
    if step.kind == "busybox":
        return busybox.busybox_inputs(config, layer)
    if step.kind == "debootstrap":
        return {"mirror": layer.mirror or apt_mirror(), "volatile_dropped": 1}
    if step.kind in TIDIED:
        return {"volatile_dropped": 1}
    if step.kind == "copy":
        return {"files": [_source_digest(step, item.src) for item in layer.files]}
    if step.kind == "directory":
        return {"tree": _source_digest(step, layer.path)}
    return {}


def _source(step: Step, rel: str) -> Path:
    path = (step.folder / rel).resolve()
    if not path.exists():
        raise BuildFailed(f"{step.where}: missing file {rel} (looked in {step.folder})")
    return path


def _source_digest(step: Step, rel: str) -> str:
    """A file's content and mode (a copy without `mode:` keeps it), or a tree's names,
    modes, owners, file contents and symlink targets."""
    path = _source(step, rel)
    if path.is_file():
        return f"{file_sha256(path)}:{stat.S_IMODE(path.stat().st_mode):o}"
    sha = hashlib.sha256()
    for sub in sorted(p for p in path.rglob("*")):
        st = sub.lstat()
        meta = f"{sub.relative_to(path)}\0{st.st_mode:o}\0{st.st_uid}:{st.st_gid}\0"
        sha.update(meta.encode())
        if stat.S_ISLNK(st.st_mode):
            sha.update(os.fsencode(os.readlink(sub)))
        elif stat.S_ISREG(st.st_mode):
            sha.update(file_sha256(sub).encode())
    return sha.hexdigest()


def build_base(config: Config, step: Step, root: Path, log: Path) -> None:
    """Fill an empty root from a base kind (busybox, debootstrap or a directory)."""
    if step.kind == "busybox":
        busybox.build_busybox(config, step.layer, root)
    elif step.kind == "directory":
        source = _source(step, step.layer.path)
        run_tool(["cp", "-a", "--", f"{source}/.", str(root)], step.where)
    elif step.kind == "debootstrap":
        _debootstrap(step, root, log)
    else:
        raise BuildFailed(f"{step.where}: not a base this builder makes directly")


def _debootstrap(step: Step, root: Path, log: Path) -> None:
    layer = step.layer
    argv = ["debootstrap", f"--variant={layer.variant}",
            f"--components={','.join(layer.components)}"]
    if layer.packages:
        argv.append(f"--include={','.join(layer.packages)}")
    argv += [layer.suite, str(root), layer.mirror or apt_mirror()]
    with open(log, "ab") as out:
        out.write(f"\n### {step.where}: {' '.join(argv)}\n".encode())
    env = {**os.environ, EPOCH_ENV: str(source_date_epoch())}  # as chroot.chroot_env
    run_tool(["sh", "-c", f'INITRD=No "$@" >>{log} 2>&1', "sh", *argv], step.where, env=env)
    _trim(root)
    _forget_host(root)


def _forget_host(root: Path) -> None:
    """Drop what debootstrap copied from the build host: per-node data (host keys,
    hostname) comes from overlays at boot (the machine-id goes in drop_volatile)."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/hostname").write_text("localhost\n")


def drop_volatile(upper: Path) -> None:
    """Make a package-built layer (its overlayfs upper dir) the same for the same packages:
    log files, apt and ldconfig caches, dpkg's -old copies and the random seed are removed
    (directories stay), a machine-id is emptied (systemd makes one at boot). Only regular
    files in this layer are touched, never a whiteout."""
    for rel in VOLATILE_FILES:
        _unlink_file(upper / rel)
    for rel in VOLATILE_TREES:
        top = upper / rel
        if top.is_dir() and not top.is_symlink():
            for folder, _, files in os.walk(top):
                for name in files:
                    _unlink_file(Path(folder) / name)
    machine_id = upper / "etc/machine-id"
    if machine_id.is_file() and not machine_id.is_symlink() and machine_id.stat().st_size:
        machine_id.write_text("")


def _unlink_file(path: Path) -> None:
    if path.is_file() and not path.is_symlink():
        path.unlink()


def _trim(root: Path) -> None:
    for rel in TRIM:
        target = root / rel
        if target.is_dir() and not target.is_symlink():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()


def apply_step(config: Config, step: Step, root: Path, log: Path) -> None:
    """Apply a packages/copy/run layer to the merged root of the layer being built."""
    if step.kind == "copy":
        for item in step.layer.files:
            _copy(step, item, root)
    elif step.kind == "packages":
        with chroot.system_mounts(root), no_services(root):
            chroot.run_in_chroot(root, _apt_command(step.layer), log, step.where)
    elif step.kind == "run":
        with chroot.system_mounts(root), no_services(root):
            for command in step.layer.commands:
                chroot.run_in_chroot(root, command, log, step.where)
    else:
        raise BuildFailed(f"{step.where}: cannot be applied on top of a parent")


def _apt_command(layer) -> str:
    parts = ["apt-get update -q"]
    if layer.install:
        parts.append("apt-get install -y -q --no-install-recommends " + " ".join(layer.install))
    if layer.purge:
        parts.append("apt-get purge -y -q --auto-remove " + " ".join(layer.purge))
    return " && ".join(parts + ["apt-get clean", CLEANUP])


class no_services:
    """A policy-rc.d that stops package scripts from starting daemons in the chroot."""

    def __init__(self, root: Path):
        self.path = root / chroot.POLICY_RC
        self.ours = not (self.path.exists() or self.path.is_symlink())

    def __enter__(self):
        if not self.ours:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("#!/bin/sh\nexit 101\n")
        os.chmod(self.path, 0o755)

    def __exit__(self, *exc):
        if self.ours:
            self.path.unlink(missing_ok=True)


def _copy(step: Step, item, root: Path) -> None:
    source = _source(step, item.src)
    if source.is_dir():
        _copy_tree(source, root, item.dest)
        return
    dest = chroot.resolve_in_root(root, item.dest)
    if dest.is_dir() and not dest.is_symlink():
        dest = dest / source.name
    _unlink_non_dir(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    os.chmod(dest, int(item.mode, 8) if item.mode else source.stat().st_mode & 0o7777)


def _copy_tree(source: Path, root: Path, dest: str) -> None:
    """A folder into the image (modes and mtimes kept, symlinks as symlinks), each folder
    resolved inside the image: an image's symlink, even an absolute one, stays inside it."""
    made = []
    for folder, dirs, files in os.walk(source):
        rel = os.path.relpath(folder, source)
        here = chroot.resolve_in_root(root, dest if rel == "." else f"{dest}/{rel}", True)
        here.mkdir(parents=True, exist_ok=True)
        made.append((folder, here))
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for name in sorted(files + links):
            _unlink_non_dir(here / name)
            shutil.copy2(os.path.join(folder, name), here / name, follow_symlinks=False)
    for folder, here in reversed(made):  # after their contents, as cp -a does
        shutil.copystat(folder, here)


def _unlink_non_dir(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
