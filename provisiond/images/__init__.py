"""Layered, content-addressed node images: recipes, the layer builder, OCI import, blobs.

Public API (see docs/contracts.md): load_manifest, blob_path, list_images, build_image,
plus delete_image, import_archive and collect_garbage for the CLI.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from provisiond.atomic import write_atomic
from provisiond.config import Config
from provisiond.errors import InvalidInput
from provisiond.images.blobs import blob_path
from provisiond.images.chroot import require_build_privileges
from provisiond.images.build import build_image
from provisiond.images.manifests import (check_name, collect_garbage, delete_image,
                                         list_images, load_manifest)
from provisiond.images.recipe import RECIPE_FILE, RecipeError, load_recipe


def import_archive(config: Config, archive: Path, name: str, progress=None,
                   kernel_args: list[str] | None = None, init: str = "/sbin/init") -> dict:
    """Make image `name` from an OCI layout or docker-archive tarball and build it.

    The archive is copied into `<state>/recipes/<name>/` beside a generated image.yaml,
    so the image can be rebuilt like any other; a failed import puts the previous
    folder back, so the image it built can still be rebuilt.
    """
    check_name(name)  # before anything is written under recipes/<name>
    require_build_privileges("an image import")
    archive = Path(archive)
    if not archive.exists():
        raise InvalidInput(f"no such archive: {archive}")
    folder = config.state_dir / "recipes" / name
    staged, previous = folder.with_name(f".{name}.import"), folder.with_name(f".{name}.previous")
    for stale in (staged, previous):
        shutil.rmtree(stale, ignore_errors=True)
    _stage(archive, staged, kernel_args or [], init)
    if folder.exists():
        folder.rename(previous)
    staged.rename(folder)
    try:
        manifest = build_image(config, name, progress)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        if previous.exists():
            previous.rename(folder)
        raise
    shutil.rmtree(previous, ignore_errors=True)
    return manifest


def _stage(archive: Path, folder: Path, kernel_args: list[str], init: str) -> None:
    """The archive and its generated recipe in a folder of their own."""
    folder.mkdir(parents=True)
    target = folder / ("oci" if archive.is_dir() else "archive.tar")
    if archive.is_dir():
        shutil.copytree(archive, target)
    else:
        shutil.copyfile(archive, target)
    recipe = {"description": f"imported from {archive.name}", "init": init,
              "kernel_args": kernel_args, "layers": [{"kind": "oci-archive", "path": target.name}]}
    write_atomic(folder / RECIPE_FILE, yaml.safe_dump(recipe, sort_keys=False))


__all__ = ["blob_path", "build_image", "collect_garbage", "delete_image", "import_archive",
           "list_images", "load_manifest", "load_recipe", "RecipeError"]
