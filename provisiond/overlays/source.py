"""Overlay sources: directory trees on the search path, templates compiled once.

`overlays/<name>/` holds the files as they land on the node. A file ending in `.j2` is a
Jinja2 template rendered to the name without `.j2`; other files are copied with their mode,
symlinks stay symlinks. An optional `overlay.yaml` at the top (not packed) may set:

    description: one line
    secret: true            # runtime overlays only (holds per-node secrets)
    modes: {path: "0600"}   # modes git cannot keep (files and directories)
    links: {path: target}   # symlinks a wheel cannot carry (the shipped overlays use these)
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from jinja2 import meta, nodes

from provisiond.config import CONTROL_RE, Config
from provisiond.errors import InvalidInput, OverlayNotFound
from provisiond.overlays.templates import (ENVIRONMENT, compile_template, fields_read,
                                           reads_whole_context)
from provisiond.state.layout import overlay_search_path

META_FILE = "overlay.yaml"
TEMPLATE_SUFFIX = ".j2"
# What a template that reads variables without naming them is taken to read (secrets are
# only given to the templates that name them).
EVERY_VARIABLE = frozenset({"node", "nodes", "server", "image", "overlay", "slurm_conf"})


@dataclass
class SourceFile:
    """One path of an overlay: `target` is where it lands on the node."""

    rel: str
    target: str
    kind: str
    """template, file, symlink or dir"""
    mode: int
    data: bytes
    template: object = None


@dataclass
class Overlay:
    name: str
    root: Path
    files: list[SourceFile]
    uses: frozenset[str]
    digest: str
    node_fields: frozenset[str] | None = None
    """The fields of `node` its templates read; None: possibly all of them."""
    secret_files: tuple[str, ...] = ()
    """The templates that read `secrets` (runtime overlays only)."""
    description: str = ""
    secret: bool = False
    dir_modes: dict[str, int] = field(default_factory=dict)

    @property
    def runtime_only(self) -> bool:
        """Whether it holds secrets: its overlay.yaml says so (`secret: true`) or one of
        its templates reads `secrets`. Such an overlay is never a system overlay."""
        return self.secret or bool(self.secret_files)

    @property
    def node_specific(self) -> bool:
        """Whether its rendering differs from node to node."""
        return bool(self.uses & {"node", "secrets"})


def find_overlay_dir(config: Config, name: str) -> Path:
    """The first search-path directory holding `name` (a site overlay shadows a shipped one)."""
    if "/" in name or name.startswith("."):
        raise InvalidInput(f"invalid overlay name {name!r}")
    for base in overlay_search_path(config):
        if (base / name).is_dir():
            return base / name
    raise OverlayNotFound(f"no overlay named {name!r} in {_search_text(config)}")


def list_overlay_dirs(config: Config) -> dict[str, tuple[Path, list[Path]]]:
    """name -> (the directory that wins, the directories it shadows)."""
    found: dict[str, tuple[Path, list[Path]]] = {}
    for base in overlay_search_path(config):
        for entry in sorted(base.iterdir()) if base.is_dir() else []:
            if entry.is_dir() and not entry.name.startswith("."):
                if entry.name in found:
                    found[entry.name][1].append(entry)
                else:
                    found[entry.name] = (entry, [])
    return dict(sorted(found.items()))


def _search_text(config: Config) -> str:
    return ", ".join(str(p) for p in overlay_search_path(config))


_CACHE: dict[Path, tuple[tuple, Overlay]] = {}


def load_overlay(config: Config, name: str) -> Overlay:
    """The overlay `name`, read and compiled again only when one of its files changed."""
    root = find_overlay_dir(config, name)
    signature = _signature(root)
    cached = _CACHE.get(root)
    if cached and cached[0] == signature:
        return cached[1]
    overlay = _read_overlay(name, root)
    _CACHE[root] = (signature, overlay)
    return overlay


def _walk(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for entry in sorted(dirnames + filenames):
            path = Path(dirpath) / entry
            yield path.relative_to(root).as_posix(), path


def _signature(root: Path) -> tuple:
    parts = []
    for rel, path in _walk(root):
        st = path.lstat()
        parts.append((rel, st.st_mtime_ns, st.st_size, st.st_mode))
    return tuple(parts)


def _read_meta(root: Path) -> dict:
    path = root / META_FILE
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not UTF-8 (byte {exc.start})") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: expected a mapping")
    return data


def _read_overlay(name: str, root: Path) -> Overlay:
    meta_data = _read_meta(root)
    modes = _read_modes(root / META_FILE, meta_data.get("modes") or {})
    files = [_source_file(name, _checked_name(name, rel), path, modes)
             for rel, path in _walk(root) if rel != META_FILE]
    files += _declared_links(root, meta_data.get("links") or {}, {f.rel for f in files})
    parsed = [(f.rel, _parse(f)) for f in files if f.kind == "template"]
    trees = [tree for _, tree in parsed]
    read = [(rel, _variables(tree)) for rel, tree in parsed]
    uses = frozenset().union(*(variables for _, variables in read))
    return Overlay(
        name=name, root=root, files=files, uses=uses, digest=_digest(files, modes),
        node_fields=_node_fields(trees),
        secret_files=tuple(rel for rel, variables in read if "secrets" in variables),
        description=str(meta_data.get("description", "")), secret=bool(meta_data.get("secret")),
        dir_modes=modes)


def _checked_name(overlay: str, rel: str) -> str:
    """`rel`, a path of the overlay's tree, unless a node could not copy it: the node's
    /init (and its agent, for runtime overlays) reads the overlay's file names a line at a
    time, so a newline in one broke the copy; other control characters are refused too
    (settings and inventory share the rule), and names that are not UTF-8 (packing one
    stopped the build with a UnicodeEncodeError traceback)."""
    try:
        rel.encode()
    except UnicodeEncodeError:  # os.walk's surrogate escapes
        raise InvalidInput(f"overlay {overlay}: file {rel!r}: its name is not UTF-8: rename "
                           "it") from None
    if CONTROL_RE.search(rel):
        raise InvalidInput(f"overlay {overlay}: file {rel!r}: a control character in its "
                           "name (a newline breaks the node's copy of the overlay): rename it")
    return rel


def _checked_target(overlay: str, rel: str, path: Path) -> bytes:
    """A symlink's target, held to the rule of `links:` targets: one that is not UTF-8
    stopped the build with a UnicodeEncodeError traceback."""
    target = os.readlink(path)
    try:
        data = target.encode()
    except UnicodeEncodeError:  # os.readlink's surrogate escapes
        raise InvalidInput(f"overlay {overlay}: symlink {rel!r}: its target {target!r} is "
                           "not UTF-8: link it again") from None
    if CONTROL_RE.search(target):
        raise InvalidInput(f"overlay {overlay}: symlink {rel!r}: a control character in its "
                           f"target {target!r}: link it again")
    return data


def _read_modes(path: Path, raw) -> dict[str, int]:
    """`modes:` of overlay.yaml as {path: mode}; a bad entry is one error line. A mode must
    be a quoted string: YAML reads an unquoted 0640 as the number 416."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path}: modes: expected a mapping of path to mode")
    modes = {}
    for key, value in raw.items():
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            modes[str(key).strip("/")] = int(value, 8)
        except ValueError:
            raise InvalidInput(f"{path}: modes: {key}: {value!r} is not an octal mode in "
                               f"quotes, such as \"0644\"") from None
    return modes


def _declared_links(root: Path, raw, present: set[str]) -> list[SourceFile]:
    """`links:` of overlay.yaml as symlink entries; a path outside the overlay, one the tree
    holds too, or a target with a control character is one error line."""
    where = root / META_FILE
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: links: expected a mapping of path to target")
    links = []
    for key, target in raw.items():
        rel = str(key).strip("/")
        if (not rel or ".." in rel.split("/") or rel in present or not isinstance(target, str)
                or not target or CONTROL_RE.search(rel + target)):
            raise InvalidInput(f"{where}: links: {key}: {target!r} is not a link the overlay "
                               "can hold (a path inside it, not also a file, to a target)")
        links.append(SourceFile(rel, rel, "symlink", 0o777, target.encode()))
    return links


def _source_file(name: str, rel: str, path: Path, modes: dict[str, int]) -> SourceFile:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return SourceFile(rel, rel, "symlink", 0o777, _checked_target(name, rel, path))
    perm = modes.get(rel.removesuffix(TEMPLATE_SUFFIX), stat.S_IMODE(st.st_mode))
    if stat.S_ISDIR(st.st_mode):
        return SourceFile(rel, rel, "dir", modes.get(rel, 0o755), b"")
    data = path.read_bytes()
    if not rel.endswith(TEMPLATE_SUFFIX):
        return SourceFile(rel, rel, "file", perm, data)
    target = rel.removesuffix(TEMPLATE_SUFFIX)
    template = compile_template(name, rel, path, data)
    return SourceFile(rel, target, "template", perm, data, template)


def _parse(source: SourceFile) -> nodes.Template:
    """The template's syntax tree (compile_template has already reported syntax errors)."""
    return ENVIRONMENT.parse(source.data.decode())


def _variables(tree: nodes.Template) -> frozenset[str]:
    if reads_whole_context(tree):
        return EVERY_VARIABLE
    return frozenset(meta.find_undeclared_variables(tree))


def _node_fields(trees: list[nodes.Template]) -> frozenset[str] | None:
    fields: set[str] = set()
    for tree in trees:
        read = None if reads_whole_context(tree) else fields_read(tree, "node")
        if read is None:
            return None
        fields |= read
    return frozenset(fields)


def _digest(files: list[SourceFile], modes: dict[str, int]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.rel}\0{f.kind}\0{f.mode:o}\0{len(f.data)}\0".encode())
        digest.update(f.data)
    digest.update(repr(sorted(modes.items())).encode())
    return digest.hexdigest()

