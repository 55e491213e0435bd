"""The layer builder: each layer is the overlayfs upper dir over its parents, packed as a
deterministic cpio, stored as a blob, and cached by a key over its parent and inputs.

Built trees stay under `<state>/cache/layers/<key>` so the next layer (or a rebuild) can
mount them as lower dirs; `<key>.json` beside a tree records its blob.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from provisiond.atomic import write_atomic
from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.images import chroot
from provisiond.images.blobs import blob_path, compressed, open_blob
from provisiond.images.cpio import (MTIME_CLAMP, is_whiteout, pack_tree, source_date_epoch,
                                   walk_tree)
from provisiond.images.kernel import is_kernel_file
from provisiond.state.layout import Layout
from provisiond.state.models import LayerRecord

log = logging.getLogger("provisiond.images")
WHITEOUTS = ".provisiond/whiteouts"
# A layer's file or link where a lower layer has a directory is packed again under
# REPLACING/<depth, 3 digits>/<path>; REPLACEMENTS lists those the node's /init moves into
# place ("<depth>/<path>" a line). See replaced_dirs.
REPLACEMENTS = ".provisiond/replacements"
REPLACING = ".provisiond/replacements.d"
OPAQUE = "trusted.overlay.opaque"


@dataclass
class LayerPlan:
    """A layer to build: its cache key and how to fill it (`make(root)`)."""

    key: str
    kind: str
    description: str
    make: Callable[[Path], None]
    mount_parents: bool = True
    tidy: Callable[[Path], None] | None = None  # run on the finished upper dir, unmounted


def layer_key(parent: str | None, kind: str, entry: dict, inputs: dict, compression: str) -> str:
    """The cache key: a hash over the parent's key and everything the layer is made from
    (the mtime clamp too when SOURCE_DATE_EPOCH sets another one)."""
    doc = {"parent": parent, "kind": kind, "entry": entry, "inputs": inputs,
           "compression": compression, "format": 4}
    if source_date_epoch() != MTIME_CLAMP:
        doc["epoch"] = source_date_epoch()
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def layer_dir(config: Config) -> Path:
    """The layer cache (Layout.layers), for provisiond.images.squash."""
    return Layout.of(config).layers


def cached_layer(config: Config, key: str) -> dict | None:
    """The record of a built layer whose tree and blob both still exist, else None (a
    damaged record too: the layer is built again)."""
    layout = Layout.of(config)
    record = read_layer_record(layout.layer_record(key))
    if record is None or not layout.layer_tree(key).is_dir():
        return None
    return record.document() if blob_path(config, record.digest).is_file() else None


def read_layer_record(path: Path) -> LayerRecord | None:
    """A layer record; None when it is missing or damaged (logged)."""
    try:
        return LayerRecord.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable layer record, ignored: %s", path, exc)
        return None


def build_layer(config: Config, plan: LayerPlan, parents: list[dict], compression: str,
                log: Path) -> dict:
    """Build one layer over its parents' trees, pack it, store it; returns its record."""
    started = time.monotonic()
    layout = Layout.of(config)
    root = layout.layers
    upper, work = root / f"{plan.key}.tmp", root / f"{plan.key}.work"
    for stale in (upper, work):
        _remove_tree(stale)
    upper.mkdir(parents=True)
    try:
        _fill(plan, upper, work, [root / p["key"] for p in reversed(parents)])
        if plan.tidy is not None:
            plan.tidy(upper)
        record = _pack(config, plan, upper, work, parents, compression)
        _remove_tree(layout.layer_tree(plan.key))
        upper.rename(layout.layer_tree(plan.key))
    finally:
        _remove_tree(upper)
        _remove_tree(work)
    record["build_seconds"] = round(time.monotonic() - started, 3)
    write_atomic(layout.layer_record(plan.key), LayerRecord.model_validate(record).text())
    return record


def _fill(plan: LayerPlan, upper: Path, work: Path, lowers: list[Path]) -> None:
    if not lowers or not plan.mount_parents:
        plan.make(upper)
        return
    with chroot.overlay(lowers, upper, work / "w", work / "merged") as merged:
        plan.make(merged)


def _pack(config: Config, plan: LayerPlan, upper: Path, work: Path, parents: list[dict],
          compression: str) -> dict:
    trees = [Layout.of(config).layer_tree(p["key"]) for p in parents]
    replaced = replaced_dirs(upper, trees)
    deletes = bool(replaced) or has_deletions(upper)  # a replaced dir's files are deleted
    lists = {WHITEOUTS: ""}
    if deletes or any(p.get("deletes") for p in parents):
        lists = final_lists(trees + [upper], [p.get("replaced", []) for p in parents]
                            + [replaced], work / "view")
    side = f"{REPLACING}/{len(parents):03d}"
    with open_blob(config) as blob:
        with compressed(blob.hashing, compression) as stream:
            entries = pack_tree(upper, stream, {k: v.encode() for k, v in lists.items()},
                                exclude=is_kernel_file, mtime=source_date_epoch(),
                                copies={f"{side}/{rel}": rel for rel in replaced})
        digest = blob.commit()
    return {"key": plan.key, "digest": digest, "size": blob.size, "kind": plan.kind,
            "compression": compression, "description": plan.description,
            "entries": entries, "deletes": deletes,
            "whiteouts": lists[WHITEOUTS].count("\n"), "replaced": replaced}


def has_deletions(tree: Path) -> bool:
    """Whether a layer tree deletes anything below it (whiteout devices or opaque dirs)."""
    for rel, st in walk_tree(tree):
        if is_whiteout(st):
            return True
        if stat.S_ISDIR(st.st_mode) and is_opaque(tree / rel):
            return True
    return False


def is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def replaced_dirs(upper: Path, lowers: list[Path]) -> list[str]:
    """Paths where `upper` has a non-directory and a lower tree a directory, sorted.

    The kernel's initramfs unpacking removes an entry of another type with rmdir, which
    fails on a directory that is not empty (init/initramfs.c, clean_path), so the layer's
    file or link would never be written there. Whiteouts or opaque dirs in between do not
    matter: the kernel unpacks every layer. Only real directories count (none below a
    symlink of the lower tree, which the kernel would not unpack either), and no socket
    (packed nowhere: /init would find nothing to move in and stop the boot).
    """
    found: list[str] = []
    real = {"": [(str(tree), _subdirs(str(tree))) for tree in lowers]}
    for rel, st in walk_tree(upper, is_kernel_file):  # each directory before its contents
        parent, name = os.path.split(rel)
        holding = [path for path, subdirs in real.get(parent, ()) if name in subdirs]
        if stat.S_ISDIR(st.st_mode):  # where rel is a real directory, and its subdirs
            real[rel] = [(f"{path}/{name}", _subdirs(f"{path}/{name}")) for path in holding]
        elif holding and not is_whiteout(st) and not stat.S_ISSOCK(st.st_mode):
            found.append(rel)
    return found


def _subdirs(path: str) -> set[str]:
    """The names of the directories in `path` (not of symlinks to one)."""
    try:
        with os.scandir(path) as entries:
            return {entry.name for entry in entries if entry.is_dir(follow_symlinks=False)}
    except OSError:
        return set()


def final_lists(chain: list[Path], replaced: list[list[str]], view: Path) -> dict[str, str]:
    """The files the top of `chain` carries for the node's /init: the image's whiteout
    list and, when a layer of the chain replaced a directory (`replaced`: replaced_dirs of
    each layer, bottom first), its replacement list."""
    with chroot.overlay(list(reversed(chain)), None, view / "w", view / "merged") as merged:
        present = dict(walk_tree(merged))
    lists = {WHITEOUTS: whiteout_list(chain, present)}
    if any(replaced):
        lists[REPLACEMENTS] = replacement_list(replaced, present)
    return lists


def whiteout_list(chain: list[Path], present: dict[str, os.stat_result]) -> str:
    """Paths the kernel unpacks from these layers that the final image must not have.

    The union of every layer's packed paths, minus what the merged overlay view shows
    (`present`); a listed directory covers its children. One absolute path per line.
    """
    unpacked: set[str] = set()
    for tree in chain:
        unpacked.update(rel for rel, st in walk_tree(tree, is_kernel_file)
                        if not is_whiteout(st))
    gone = unpacked - present.keys()
    kept = [rel for rel in sorted(gone) if not _has_parent_in(rel, gone)]
    return "".join(f"/{_one_a_line(rel, 'deletes', 'whiteout')}\n" for rel in kept)


def replacement_list(replaced: list[list[str]], present: dict[str, os.stat_result]) -> str:
    """`<depth>/<path>` a line for each replaced path the final image (`present`) shows as
    a non-directory: the entry of the highest layer that replaced it, the one the merged
    view shows (a layer above with that path has it as a directory, or replaced it too).
    The whiteouts have emptied the kernel's directory there when /init moves it in."""
    top = {rel: depth for depth, paths in enumerate(replaced) for rel in paths}
    kept = [rel for rel in sorted(top)
            if rel in present and not stat.S_ISDIR(present[rel].st_mode)]
    return "".join(f"{top[rel]:03d}/{_one_a_line(rel, 'replaces', 'replacement')}\n"
                   for rel in kept)


def _one_a_line(rel: str, verb: str, name: str) -> str:
    if "\n" in rel:  # the lists have one path a line: "x\n/etc" would list /etc
        raise BuildFailed(f"the image {verb} {'/' + rel!r}, whose name has a newline: "
                          f"the {name} list cannot hold it")
    return rel


def _has_parent_in(rel: str, paths: set[str]) -> bool:
    parts = rel.split("/")
    return any("/".join(parts[:i]) in paths for i in range(1, len(parts)))


def shell_sessions(layout: Layout) -> dict[Path, set[str]]:
    """The `image shell` sessions' folders and the keys of the layer trees each mounts
    (its `lowers` file, written before it mounts them): open ones and killed ones, whose
    mounts stay until the next shell on their image clears them."""
    found: dict[Path, set[str]] = {}
    for path in layout.layers.glob(f"{layout.shell_session('*', '*').name}/lowers"):
        try:
            found[path.parent] = set(path.read_text().split())
        except OSError:  # the session ended meanwhile: its folder is going
            continue
    return found


def claim_session(lowers: Path) -> int:
    """Mark a session open for its length: its `lowers` file flocked (goes with the
    process however it ends). Returns the descriptor to close when the session is over."""
    fd = os.open(lowers, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _session_open(folder: Path) -> bool:
    try:
        fd = os.open(folder / "lowers", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: checkers never clash
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def shell_mounting(layout: Layout, key: str) -> str | None:
    """'the image shell on NAME (PID N)' when an open session mounts the layer tree
    `key`, else None. Call it holding the layer's lock: a session lists its trees under
    their locks, so none starts mounting `key` meanwhile."""
    for folder, keys in shell_sessions(layout).items():
        if key in keys and _session_open(folder):
            image = folder.name[len("shell-"):].rpartition(".")[0]
            try:
                pid = layout.image_shell_lock(image).read_text().strip() or "?"
            except OSError:
                pid = "?"
            return f"the image shell on {image} (PID {pid})"
    return None


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        chroot.unmount_below(path)
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
