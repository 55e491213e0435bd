"""The kernel: modules picked from a Debian linux-image package, and the vmlinuz blob.

No depmod is needed on the build host: module dependencies are read from each module's
`.modinfo` ELF section and written as `modules.dep`, which busybox's modprobe reads.
"""

from __future__ import annotations

import gzip
import lzma
import re
import struct
from pathlib import Path

import zstandard

MODULE_FILES = ("modules.builtin", "modules.builtin.modinfo", "modules.order")


def module_bytes(path: Path) -> bytes:
    """A module's ELF: a .ko as it is, a .ko.xz, .ko.zst or .ko.gz (Debian 13 ships .ko.xz)
    decompressed, as busybox's insmod and modinfo need it."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".zst"):
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    return data


def modinfo(path: Path) -> dict[str, str]:
    """The key=value strings of a .ko's .modinfo section (64-bit little-endian ELF)."""
    data = module_bytes(path)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names_off = sections[shstrndx][4]
    for name_off, _type, _flags, _addr, offset, size in sections:
        end = data.index(b"\0", names_off + name_off)
        if data[names_off + name_off:end] == b".modinfo":
            pairs = data[offset:offset + size].split(b"\0")
            return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
    return {}


def module_index(moddir: Path) -> dict[str, Path]:
    """Module name (dashes as underscores) -> path of its .ko under moddir."""
    return {p.name.split(".ko")[0].replace("-", "_"): p for p in moddir.rglob("*.ko*")}


def scan_modules(moddir: Path) -> dict:
    """What modprobe needs to know of a kernel's modules: paths, dependencies, built-ins."""
    modules = {name: {"path": str(path.relative_to(moddir)),
                      "depends": [d.replace("-", "_") for d in
                                  modinfo(path).get("depends", "").split(",") if d]}
               for name, path in sorted(module_index(moddir).items())}
    return {"version": moddir.name, "modules": modules, "builtin": sorted(_builtin_names(moddir))}


def select_modules(index: dict, wanted: list[str]) -> dict[str, list[str]]:
    """The wanted modules plus everything they depend on: name -> its dependencies.

    Names built into the kernel are accepted and skipped; an unknown name is a KeyError.
    """
    modules, builtin = index["modules"], set(index["builtin"])
    chosen: dict[str, list[str]] = {}
    todo = [w.replace("-", "_") for w in wanted]
    while todo:
        name = todo.pop()
        if name in chosen or name in builtin:
            continue
        if name not in modules:
            raise KeyError(name)
        chosen[name] = modules[name]["depends"]
        todo.extend(chosen[name])
    return chosen


def _builtin_names(moddir: Path) -> set[str]:
    path = moddir / "modules.builtin"
    if not path.is_file():
        return set()
    return {re.sub(r"\.ko.*$", "", Path(line).name).replace("-", "_")
            for line in path.read_text().split()}


def write_modules_dep(moddir: Path, index: dict, chosen: dict[str, list[str]]) -> None:
    """Write modules.dep (paths relative to moddir) in the order modprobe expects."""
    paths = {name: index["modules"][name]["path"] for name in chosen}
    lines = []
    for name in sorted(chosen):
        deps = " ".join(paths[d] for d in _dep_closure(name, chosen))
        lines.append(f"{paths[name]}: {deps}".rstrip())
    (moddir / "modules.dep").write_text("\n".join(lines) + "\n")


def _dep_closure(name: str, chosen: dict[str, list[str]]) -> list[str]:
    """Dependencies in modprobe's order: loaded from the end, so the deepest come last."""
    order: list[str] = []

    def visit(mod: str) -> None:
        for dep in chosen.get(mod, []):
            if dep in chosen and dep not in order:
                visit(dep)
                if dep not in order:
                    order.append(dep)

    visit(name)
    return list(reversed(order))


def prune_modules(moddir: Path, keep: set[str]) -> None:
    """Delete every .ko not in `keep`, then the directories left empty."""
    for name, path in module_index(moddir).items():
        if name not in keep:
            path.unlink()
    for folder in sorted(moddir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()


KERNEL_RE = re.compile(r"^boot/vmlinuz-(.+)$")


def is_kernel_file(rel: str) -> bool:
    """Kernel images (and their initrds) stay out of layers: the kernel is its own blob."""
    return bool(KERNEL_RE.match(rel)) or rel.startswith("boot/initrd.img-")
