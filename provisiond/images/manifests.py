"""Image manifests (`images/<name>/manifest.json`): read, list, write, delete, and the
garbage collection of blobs that no manifest references.

Manifests are documents on the store (provisiond.state): with the files store the file it
always was, with etcd one key every server reads. A build publishes its image by putting
the manifest; a server that lacks the blobs it names fetches them from a peer when a node
asks (provisiond.boot.peers)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from provisiond.atomic import locked
from provisiond.config import Config
from provisiond.errors import BuildFailed, ImageNotFound
from provisiond.images.blobs import INCOMING, blob_path
from provisiond.images.layers import read_layer_record, shell_sessions
from provisiond.images.recipe import (RecipeError, check_image_name, read_shell_layers,
                                      tar_layer_files)
from provisiond.state import open as opening
from provisiond.state.layout import Layout
from provisiond.state.models import DamagedDocument, ImageManifest, parse
from provisiond.state.store import Entry



# What image names were before they became DNS labels (debian_12): a build under such a
# name can still be shown and deleted, never made.
OLD_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str) -> str:
    return check_image_name(name)


def _built_name(config: Config, name: str) -> str:
    """`name` if it is an image name or names an existing build under the older rule."""
    if (isinstance(name, str) and OLD_NAME_RE.fullmatch(name)
            and opening.open_store(config).get(_key(config, name)) is not None):
        return name
    return check_name(name)


def _key(config: Config, name: str) -> str:
    layout = Layout.of(config)
    return layout.key(layout.image_manifest(name))


def manifest_key(config: Config, name: str) -> str:
    """The store key of the image's manifest (a checked name)."""
    return _key(config, _built_name(config, name))


def lock_path(config: Config, name: str) -> Path:
    """The flock that serializes builds, imports and deletes of one image."""
    return Layout.of(config).image_lock(_built_name(config, name))


def gc_lock(config: Config) -> Path:
    """Builds hold it shared, gc exclusively: gc never takes a blob a build is adding."""
    return Layout.of(config).images_gc_lock


def manifest_entry(config: Config, name: str) -> Entry:
    """The stored manifest of `name` with its revision (caches compare revisions); raises
    ImageNotFound."""
    entry = opening.open_store(config).get(manifest_key(config, name))
    if entry is None:
        raise ImageNotFound(f"no image named {name!r} has been built")
    return entry


def load_manifest(config: Config, name: str) -> dict:
    """The manifest of the current build of `name` as written (a hand-edited one too, for
    `image show`; the boot reads it through ImageManifest); raises ImageNotFound, or
    DamagedDocument when it is not a JSON object."""
    return parse_manifest(manifest_entry(config, name))


def parse_manifest(entry: Entry) -> dict:
    """A stored manifest's JSON object; DamagedDocument when it is none."""
    try:
        data = json.loads(entry.value)
    except ValueError as exc:
        raise DamagedDocument(f"{entry.key}: not JSON ({exc}): build the image again"
                              ) from None
    if not isinstance(data, dict):
        raise DamagedDocument(f"{entry.key}: not a JSON object: build the image again")
    return data


def image_exists(config: Config, name: str) -> bool:
    return opening.open_store(config).get(manifest_key(config, name)) is not None


def manifest_revision(config: Config, name: str) -> int | None:
    """The store revision of the image's manifest, None when it is not built: a build
    that changed it saved its manifest (its commit)."""
    entry = opening.open_store(config).get(manifest_key(config, name))
    return None if entry is None else entry.revision


def image_generation(config: Config, name: str) -> str | None:
    """The generation of the image's current build (ImageManifest.generation): None when
    it is not built, "" when its manifest has none (built before generations, damaged)."""
    entry = opening.open_store(config).get(manifest_key(config, name))
    if entry is None:
        return None
    try:
        return generation_of(parse_manifest(entry))
    except DamagedDocument:
        return ""


def generation_of(manifest: dict) -> str:
    """A manifest's generation, "" when it has none."""
    generation = manifest.get("generation")
    return generation if isinstance(generation, str) else ""


def save_manifest(config: Config, manifest: dict) -> None:
    """Publish a build: the manifest checked against ImageManifest, put on the store, where
    every server sharing it sees it."""
    checked = parse(ImageManifest, manifest, f"image {manifest.get('name')!r}: manifest",
                    BuildFailed)
    opening.open_store(config).put(manifest_key(config, checked.name), checked.text().encode())


def list_images(config: Config) -> list[dict]:
    """Every built image's manifest, sorted by name."""
    layout = Layout.of(config)
    prefix = layout.key(layout.images) + "/"
    found = []
    for entry in opening.open_store(config).list(prefix):
        name = entry.key[len(prefix):].partition("/")[0]
        if entry.key != _key(config, name):
            continue
        try:
            found.append(parse_manifest(entry))
        except DamagedDocument:
            continue  # a damaged manifest: not listed
    return found


def delete_image(config: Config, name: str) -> None:
    """Remove an image's manifest (its blobs go at the next gc) and what the builder kept
    beside it (`image shell` layers)."""
    with locked(lock_path(config, name)):
        key = manifest_entry(config, name).key
        opening.open_store(config).delete(key)
        shutil.rmtree(Layout.of(config).path(key).parent, ignore_errors=True)


def drop_shell_layers(config: Config, name: str) -> None:
    """Remove what `image shell` added to the image (shell.json, the tarballs), as
    `delete_image` does: its replacement is saved (`image import --force`)."""
    layout = Layout.of(config)
    layout.image_shell_layers(name).unlink(missing_ok=True)
    shutil.rmtree(layout.image_shell_dir(name), ignore_errors=True)


def referenced_digests(config: Config) -> set[str]:
    """Every blob a manifest names (one edited by hand, or trimmed, too: gc stopped with a
    KeyError on a manifest without a kernel)."""
    return {blob["digest"] for manifest in list_images(config)
            for blob in _listed_blobs(manifest) if isinstance(blob.get("digest"), str)}


def listed_size(config: Config, digest: str) -> int | None:
    """The largest size the manifests give the blob `digest`, or None when none lists it
    with one (a peer's copy of it must be no longer: provisiond.boot.peers)."""
    sizes = [blob.get("size") for manifest in list_images(config)
             for blob in _listed_blobs(manifest) if blob.get("digest") == digest]
    return max((s for s in sizes if isinstance(s, int) and s > 0), default=None)


def _listed_blobs(manifest: dict) -> list[dict]:
    """The blob descriptors ({digest, size...}) a manifest names, whatever its shape."""
    mounted = manifest.get("mounted")
    mounted = mounted if isinstance(mounted, dict) else {}
    found = [manifest.get("kernel"), *_items(manifest.get("layers")),
             *_items(mounted.get("layers")), mounted.get("kit")]
    return [blob for blob in found if isinstance(blob, dict)]


def _items(value) -> list:
    return value if isinstance(value, list) else []


def collect_garbage(config: Config, shell_tarballs: bool = False) -> dict:
    """Delete blobs and cached layer trees no manifest references, but the trees an
    `image shell` session mounts; returns what went. An open session holds nothing gc
    waits for (it adds blobs only in its rebuild, a build holding the gc lock shared).
    The layer tarballs of `image shell` sessions no image lists (an admin's work) are
    listed as kept, or removed with `shell_tarballs` (see unlisted_shell_tarballs)."""
    result = _collect_blobs_and_trees(config)
    found = unlisted_shell_tarballs(config, remove=shell_tarballs)
    result["shell_tarballs_kept"] = [] if shell_tarballs else found["tarballs"]
    result["shell_tarballs_removed"] = found["tarballs"] if shell_tarballs else []
    result["shell_partials_removed"] = found["partials"]
    result["shell_listings_unreadable"] = found["unreadable"]
    return result


def _collect_blobs_and_trees(config: Config) -> dict:
    with locked(gc_lock(config)):
        keep = referenced_digests(config)
        removed, freed = 0, 0
        blobs = Layout.of(config).blobs
        if blobs.is_dir():
            for path in sorted(blobs.iterdir()):
                if path.is_file() and f"sha256:{path.name}" not in keep \
                        and not _being_written(path):
                    freed += path.stat().st_size
                    path.unlink()
                    removed += 1
        trees = _collect_trees(config, keep)
    return {"blobs_removed": removed, "bytes_freed": freed, "trees_removed": trees}


SHELL_PARTIAL_PREFIX = ".layer."
"""A tarball `image shell` is writing, under the image's lock (shell._save_layer)."""


def unlisted_shell_tarballs(config: Config, remove: bool = False) -> dict[str, list]:
    """The layer tarballs in `images/<name>/shell/` that neither the image's shell.json
    nor a recipe's `tar` layer names: those `image shell` kept when its layer could not
    be added (the rebuild failed, the image was replaced), which nothing else shows.
    {"tarballs": [{image, path, size, modified}], removed too when `remove`; "partials":
    the half-written tarballs of sessions killed as they saved theirs, always removed;
    "unreadable": [{image, error}], the images whose shell.json cannot be read (which of
    their tarballs it lists is not known: none is touched)}. Looked at under the image's
    lock, which a session holds from writing its tarball to listing it (taken after the
    gc lock is let go: a build takes the image's lock, then the gc lock). Paths are
    compared resolved, as a build resolves them; a symlink (a tarball, the shell folder
    or the image's) is never followed nor removed: gc did not make it."""
    layout = Layout.of(config)
    images_dir = Path(layout.images)
    in_recipes = tar_layer_files(config)
    found: dict[str, list] = {"tarballs": [], "partials": [], "unreadable": []}
    for folder in sorted(images_dir.iterdir()) if images_dir.is_dir() else []:
        name = folder.name
        shell_dir = Path(layout.image_shell_dir(name))
        if name.startswith(".") or not _shell_files(shell_dir):
            continue
        with locked(layout.image_lock(name)):
            try:
                listed = {(folder / entry.path).resolve() for entry in
                          read_shell_layers(layout.image_shell_layers(name), name)}
            except (RecipeError, ValueError) as exc:
                found["unreadable"].append({"image": name, "error": str(exc)})
                continue
            for path in _shell_files(shell_dir):
                if path.name.startswith(SHELL_PARTIAL_PREFIX):
                    found["partials"].append(_shell_file(name, path, remove=True))
                elif path.suffix == ".tar" and path.resolve() not in listed | in_recipes:
                    found["tarballs"].append(_shell_file(name, path, remove))
    return found


def _shell_files(folder: Path) -> list[Path]:
    """The regular files of an image's shell/ folder, none when it or the image's folder
    is a symlink (or gone)."""
    if folder.parent.is_symlink() or folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir()
                  if not path.is_symlink() and path.is_file())


def _shell_file(image: str, path: Path, remove: bool) -> dict:
    stat = path.stat()
    if remove:
        path.unlink()
    return {"image": image, "path": str(path), "size": stat.st_size,
            "modified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat.st_mtime))}


def _being_written(path: Path) -> bool:
    """A temp file written within the last hour: a fetch from a peer (which does not hold
    the gc lock, as builds do) may still be writing it; older ones are a crash's."""
    return path.name.startswith(INCOMING) and time.time() - path.stat().st_mtime < 3600


def _collect_trees(config: Config, keep: set[str]) -> int:
    removed = 0
    layout = Layout.of(config)
    folder = layout.layers
    mounted = _session_lowers(layout)
    for record_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_layer_record(record_path)
        key = record_path.stem
        if key in mounted:
            continue
        if record is None or record.digest not in keep:  # a damaged record: rebuilt anyway
            shutil.rmtree(layout.layer_tree(key), ignore_errors=True)
            layout.layer_lock(key).unlink(missing_ok=True)
            record_path.unlink()
            removed += 1
    return removed


def _session_lowers(layout: Layout) -> set[str]:
    """The layer keys `image shell` sessions mount: an open one's, whose image may have
    been deleted or rebuilt meanwhile, and a killed one's (its mounts stay until the next
    shell on its image clears them). A session writes them before it lets gc run."""
    return set().union(*shell_sessions(layout).values())


__all__ = ["blob_path", "load_manifest", "list_images", "save_manifest", "delete_image",
           "collect_garbage", "image_exists", "image_generation", "manifest_entry",
           "manifest_revision", "unlisted_shell_tarballs"]
