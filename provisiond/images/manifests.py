"""Image manifests (`images/<name>/manifest.json`): read, list, write, delete, and the
garbage collection of blobs that no manifest references."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.errors import BuildFailed, ImageNotFound
from provisiond.images.blobs import blob_path
from provisiond.images.layers import read_layer_record
from provisiond.images.recipe import check_image_name
from provisiond.images.squash import mounted_digests
from provisiond.state.layout import Layout
from provisiond.state.models import DamagedDocument, ImageManifest, parse


# What image names were before they became DNS labels (debian_12): a build under such a
# name can still be shown and deleted, never made.
OLD_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str) -> str:
    return check_image_name(name)


def _built_name(config: Config, name: str) -> str:
    """`name` if it is an image name or names an existing build under the older rule."""
    if (isinstance(name, str) and OLD_NAME_RE.fullmatch(name)
            and Layout.of(config).image_manifest(name).is_file()):
        return name
    return check_name(name)


def manifest_path(config: Config, name: str) -> Path:
    return Layout.of(config).image_manifest(_built_name(config, name))


def lock_path(config: Config, name: str) -> Path:
    """The flock that serializes builds, imports and deletes of one image."""
    return Layout.of(config).image_lock(_built_name(config, name))


def gc_lock(config: Config) -> Path:
    """Builds hold it shared, gc exclusively: gc never takes a blob a build is adding."""
    return Layout.of(config).images_gc_lock


def load_manifest(config: Config, name: str) -> dict:
    """The manifest of the current build of `name` as written (a hand-edited one too, for
    `image show`; the boot reads it through ImageManifest); raises ImageNotFound, or
    DamagedDocument when it is not a JSON object."""
    path = manifest_path(config, name)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ImageNotFound(f"no image named {name!r} has been built") from None
    except ValueError as exc:
        raise DamagedDocument(f"{path}: not JSON ({exc}): build the image again") from None
    if not isinstance(data, dict):
        raise DamagedDocument(f"{path}: not a JSON object: build the image again")
    return data


def save_manifest(config: Config, manifest: dict) -> None:
    """Publish a build: the manifest checked against ImageManifest, written atomically."""
    checked = parse(ImageManifest, manifest, f"image {manifest.get('name')!r}: manifest",
                    BuildFailed)
    write_atomic(manifest_path(config, checked.name), checked.text())


def list_images(config: Config) -> list[dict]:
    """Every built image's manifest, sorted by name."""
    layout = Layout.of(config)
    if not layout.images.is_dir():
        return []
    found = []
    every = layout.image_manifest("*").relative_to(layout.images)  # */manifest.json
    for path in sorted(layout.images.glob(str(every))):
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue  # a manifest being replaced or damaged: not listed
        if isinstance(data, dict):
            found.append(data)
    return found


def delete_image(config: Config, name: str) -> None:
    """Remove an image's manifest (its blobs go at the next gc)."""
    with locked(lock_path(config, name)):
        load_manifest(config, name)
        shutil.rmtree(Layout.of(config).image_manifest(name).parent)


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
        blobs = Layout.of(config).blobs
        if blobs.is_dir():
            for path in sorted(blobs.iterdir()):
                if path.is_file() and f"sha256:{path.name}" not in keep:
                    freed += path.stat().st_size
                    path.unlink()
                    removed += 1
        trees = _collect_trees(config, keep)
    return {"blobs_removed": removed, "bytes_freed": freed, "trees_removed": trees}


def _collect_trees(config: Config, keep: set[str]) -> int:
    removed = 0
    layout = Layout.of(config)
    folder = layout.layers
    for record_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_layer_record(record_path)
        if record is None or record.digest not in keep:  # a damaged record: rebuilt anyway
            key = record_path.stem
            shutil.rmtree(layout.layer_tree(key), ignore_errors=True)
            layout.layer_lock(key).unlink(missing_ok=True)
            record_path.unlink()
            removed += 1
    return removed


__all__ = ["blob_path", "load_manifest", "list_images", "save_manifest", "delete_image",
           "collect_garbage"]
