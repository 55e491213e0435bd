"""The `busybox` base: Debian's busybox-static with its applet links, a minimal /etc, and a
kernel with just the modules the recipe names, all from cached .debs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

from provisiond.archive import TRUSTED
from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.images import kernel
from provisiond.images.debs import deb_sha256, extract_deb, fetch_deb, run_tool
from provisiond.images.recipe import BusyboxLayer

DIRS = {"bin": 0o755, "sbin": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755, "etc": 0o755,
        "dev": 0o755, "proc": 0o555, "sys": 0o555, "run": 0o755, "tmp": 0o1777,
        "root": 0o700, "var/log": 0o755, "var/run": 0o755, "mnt": 0o755, "lib/modules": 0o755,
        "usr/share/udhcpc": 0o755}
ETC = {
    "passwd": ("root:x:0:0:root:/root:/bin/sh\n"
               "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "shadow": "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
    "hostname": "tiny\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    "os-release": ('NAME="provisiond tiny"\nID=provisiond-tiny\n'
                   'PRETTY_NAME="provisiond tiny (busybox)"\n'),
}


def busybox_inputs(config: Config, layer: BusyboxLayer) -> dict:
    """The sha256 of every .deb the layer is made from (part of its cache key)."""
    inputs = {"busybox": deb_sha256(fetch_deb(config, layer.package))}
    if layer.kernel:
        inputs["kernel"] = deb_sha256(fetch_deb(config, layer.kernel))
    return inputs


def build_busybox(config: Config, layer: BusyboxLayer, root: Path) -> None:
    """Fill an empty root with busybox, its applet links, /etc basics and the kernel."""
    for rel, mode in DIRS.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        os.chmod(root / rel, mode)
    deb = fetch_deb(config, layer.package)
    extract_deb(deb, root, keep=lambda name: name in ("bin", "bin/busybox"))
    _link_applets(root)
    for name, text in ETC.items():
        (root / "etc" / name).write_text(text)
    os.chmod(root / "etc/shadow", 0o640)
    if layer.kernel:
        add_kernel(config, layer, root)


def _link_applets(root: Path) -> None:
    busybox = root / "bin/busybox"
    if not busybox.is_file():
        raise BuildFailed("busybox: the package holds no /bin/busybox")
    applets = run_tool([str(busybox), "--list-full"], "busybox --list-full").split()
    for rel in sorted(applets):
        link = root / rel
        if link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath("/bin/busybox", "/" + os.path.dirname(rel)))


def add_kernel(config: Config, layer: BusyboxLayer, root: Path) -> None:
    """Unpack vmlinuz and the chosen modules (with their dependencies) into root.

    Unpacking a kernel .deb means decompressing ~400 MB, so the result for a module
    selection is kept beside the cached .deb as a small tar and reused by later builds.
    """
    deb = fetch_deb(config, layer.kernel)
    selection = hashlib.sha256(json.dumps(layer.modules).encode()).hexdigest()[:16]
    subset = deb.parent / f"{deb.name}.{selection}.tar"
    if subset.is_file():
        with tarfile.open(subset) as archive:
            archive.extractall(root, **TRUSTED)
        return
    extract_deb(deb, root, lambda n: n.startswith(("boot/vmlinuz-", "lib/modules/")),
                ("boot", "lib"))
    _keep_modules(_only_moddir(root), layer)
    if deb.parent.name == "debs" and layer.modules != "all":
        _save_subset(root, subset)


def _keep_modules(moddir: Path, layer: BusyboxLayer) -> None:
    index = kernel.scan_modules(moddir)
    chosen = _choose(index, _wanted(index, layer))
    kernel.prune_modules(moddir, set(chosen))
    kernel.write_modules_dep(moddir, index, chosen)
    for extra in moddir.iterdir():
        if extra.name not in (*kernel.MODULE_FILES, "modules.dep", "kernel"):
            _remove(extra)


def _save_subset(root: Path, subset: Path) -> None:
    tmp = subset.with_suffix(f".tmp{os.getpid()}")
    with tarfile.open(tmp, "w") as archive:
        archive.add(root / "boot", "boot")
        archive.add(root / "lib", "lib")
    os.replace(tmp, subset)


def _wanted(index: dict, layer: BusyboxLayer) -> list[str]:
    return sorted(index["modules"]) if layer.modules == "all" else layer.modules


def _choose(index: dict, wanted: list[str]) -> dict[str, list[str]]:
    try:
        return kernel.select_modules(index, wanted)
    except KeyError as exc:
        raise BuildFailed(f"kernel {index['version']} has no module {exc.args[0]!r}") from None


def _only_moddir(root: Path) -> Path:
    found = sorted((root / "lib/modules").iterdir())
    if len(found) != 1:
        raise BuildFailed(f"the kernel package holds {len(found)} module trees, expected one")
    return found[0]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
