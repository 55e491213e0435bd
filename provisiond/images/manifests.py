"""Image manifests (`images/<name>/manifest.json`): read, list, write, delete, and the
garbage collection of blobs that no manifest references."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.errors import ImageNotFound
from provisiond.images.blobs import blob_path
from provisiond.images.layers import layer_dir
from provisiond.images.recipe import check_image_name
from provisiond.images.squash import mounted_digests

MANIFEST = "manifest.json"


# What image names were before they became DNS labels (debian_12): a build under such a
# name can still be shown and deleted, never made.
OLD_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str) -> str:
    return check_image_name(name)


def _built_name(config: Config, name: str) -> str:
    """`name` if it is an image name or names an existing build under the older rule."""
    if (isinstance(name, str) and OLD_NAME_RE.fullmatch(name)
            and (config.images_dir / name / MANIFEST).is_file()):
        return name
    return check_name(name)


def manifest_path(config: Config, name: str) -> Path:
    return config.images_dir / _built_name(config, name) / MANIFEST


def lock_path(config: Config, name: str) -> Path:
    """The flock that serializes builds, imports and deletes of one image."""
    return config.images_dir / ".locks" / f"{_built_name(config, name)}.lock"


def gc_lock(config: Config) -> Path:
    """Builds hold it shared, gc exclusively: gc never takes a blob a build is adding."""
    return config.images_dir / ".locks" / "gc.lock"


def load_manifest(config: Config, name: str) -> dict:
    """The manifest of the current build of `name`; raises ImageNotFound."""
    path = manifest_path(config, name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ImageNotFound(f"no image named {name!r} has been built") from None


def save_manifest(config: Config, manifest: dict) -> None:
    path = manifest_path(config, manifest["name"])
    write_atomic(path, json.dumps(manifest, indent=2) + "\n")


def list_images(config: Config) -> list[dict]:
    """Every built image's manifest, sorted by name."""
    if not config.images_dir.is_dir():
        return []
    found = []
    for path in sorted(config.images_dir.glob(f"*/{MANIFEST}")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a manifest being replaced or damaged: not listed
    return found


def delete_image(config: Config, name: str) -> None:
    """Remove an image's manifest (its blobs go at the next gc)."""
    with locked(lock_path(config, name)):
        load_manifest(config, name)
        shutil.rmtree(config.images_dir / name)


def referenced_digests(config: Config) -> set[str]:
    digests: set[str] = set()
    for manifest in list_images(config):
        digests.add(manifest["kernel"]["digest"])
        digests.update(layer["digest"] for layer in manifest["layers"])
        digests.update(mounted_digests(manifest))
    return digests


def collect_garbage(config: Config) -> dict:
    """Delete blobs and cached layer trees no manifest references; returns what went."""
    with locked(gc_lock(config)):
        keep = referenced_digests(config)
        removed, freed = 0, 0
        if config.blob_dir.is_dir():
            for path in sorted(config.blob_dir.iterdir()):
                if path.is_file() and f"sha256:{path.name}" not in keep:
                    freed += path.stat().st_size
                    path.unlink()
                    removed += 1
        trees = _collect_trees(config, keep)
    return {"blobs_removed": removed, "bytes_freed": freed, "trees_removed": trees}


def _collect_trees(config: Config, keep: set[str]) -> int:
    removed = 0
    folder = layer_dir(config)
    for record_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = json.loads(record_path.read_text())
        if record.get("digest") not in keep:
            shutil.rmtree(folder / record_path.stem, ignore_errors=True)
            (folder / "locks" / f"{record_path.stem}.lock").unlink(missing_ok=True)
            record_path.unlink()
            removed += 1
    return removed


__all__ = ["blob_path", "load_manifest", "list_images", "save_manifest", "delete_image",
           "collect_garbage"]
