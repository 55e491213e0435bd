"""Layered, content-addressed node images: recipes, the layer builder, OCI import, blobs.

Public API (see docs/contracts.md): load_manifest, blob_path, list_images, build_image,
plus delete_image, import_image and collect_garbage for the CLI.
"""

from __future__ import annotations

import enum
import shutil
from pathlib import Path

import yaml

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.errors import AlreadyExists, Conflict, InvalidInput
from provisiond.images.blobs import blob_path
from provisiond.images import registry
from provisiond.images.chroot import require_build_privileges
from provisiond.images.build import build_image
from provisiond.images.layout import LayoutWriter, copy_layout
from provisiond.images.manifests import (check_name, collect_garbage, delete_image,
                                         image_exists, list_images, load_manifest, lock_path,
                                         manifest_revision)
from provisiond.images.recipe import RECIPE_FILE, RecipeError, load_recipe, read_shell_layers
from provisiond.images.swap import end_swap, swap_in
from provisiond.state.layout import (IMPORTED_ARCHIVE, IMPORTED_LAYOUT, Layout,
                                     recipe_search_path)


class OverExisting(enum.Enum):
    """What an import does when the image (or its recipe in the state dir) exists."""

    REFUSE = "refuse"
    REPLACE = "replace"  # --force: as a delete then an import (its shell layers dropped)
    UPDATE = "update"  # --update: the new content under the image's shell layers


def import_image(config: Config, source: str, name: str, progress=None,
                 kernel_args: list[str] | None = None, init: str = "/sbin/init",
                 access: registry.Access | None = None,
                 over: OverExisting = OverExisting.REFUSE) -> dict:
    """Make image `name` from `docker://REGISTRY/REPO:TAG`, `oci:DIR[:TAG]`, or an OCI
    layout or docker-archive tarball or folder given by its path, and build it.

    The image is copied into `<state>/recipes/<name>/` beside a generated image.yaml, so it
    can be rebuilt like any other; a failed import leaves nothing of itself and puts the
    previous folder back, so the image it built can still be rebuilt. `access`: a
    registry's login and TLS options (registry_access.Access). `over`: an existing image
    of the name is refused (AlreadyExists), replaced, or updated (OverExisting).
    """
    check_name(name)  # before anything is written under recipes/<name>
    require_build_privileges("an image import")
    _refuse_shadowed(config, name)
    # one import of a name at a time: each would take the other's staging folder as stale
    with locked(Layout.of(config).image_import_lock(name)):
        with locked(lock_path(config, name)):
            end_swap(config, name)  # a killed import's: undone or finished first
            _refuse_existing(config, name, over)  # before a download, and again at the swap
        return _import(config, source, name, progress, kernel_args or [], init, access, over)


def _import(config: Config, source: str, name: str, progress, kernel_args: list[str],
            init: str, access: registry.Access | None, over: OverExisting) -> dict:
    staged = Layout.of(config).recipe_aside(name, "import")
    shutil.rmtree(staged, ignore_errors=True)  # a killed import's
    try:
        _stage(config, source, staged, kernel_args, init, access, progress)
        # the swap, the build and its undoing as one: no build or shell exit in between
        with locked(lock_path(config, name)):
            _refuse_existing(config, name, over)
            return _swap_and_build(config, name, staged, progress,
                                   over is OverExisting.REPLACE)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _swap_and_build(config: Config, name: str, staged: Path, progress, replace: bool) -> dict:
    """The staged folder as the image's recipe, built; the previous folder put back when
    no manifest was saved (provisiond.images.swap). The saved manifest is the commit: an
    interrupt after it (the undo put the previous recipe back under the new image, which
    the next build made again) finishes the import, as `image shell`'s rebuild does."""
    before = swap_in(config, name, staged, replace)
    try:
        manifest = build_image(config, name, progress, lock_held=True, replace=replace)
        end_swap(config, name)
        return manifest
    except BaseException as exc:
        end_swap(config, name)
        if manifest_revision(config, name) == before or not isinstance(exc, KeyboardInterrupt):
            raise
        return load_manifest(config, name)


def _refuse_existing(config: Config, name: str, over: OverExisting) -> None:
    """AlreadyExists, one line, when `name` is a built image or has a recipe folder in the
    state dir (an unbuilt site recipe, a deleted image's import) and `over` is REFUSE:
    the import would replace it, and put the layers `image shell` added to the image on
    top of content they were not made on. Also when the name has a shipped recipe: the
    import's recipe would shadow it (silently, as it did); with `over` UPDATE too when it
    is not built (there is no image to import into)."""
    if over is OverExisting.REPLACE:
        return
    folder = Layout.of(config).recipe_dir(name)
    shipped = None if folder.exists() else _shadowed_by_import(config, name)
    if over is OverExisting.UPDATE:
        if shipped and not image_exists(config, name):
            raise AlreadyExists(f"image {name} is not built but has a shipped recipe, "
                                f"{shipped}: --update has no image to import into, and an "
                                f"import would shadow the recipe (until {folder} is "
                                "removed); --force imports anyway")
        return
    if image_exists(config, name):
        added = len(read_shell_layers(Layout.of(config).image_shell_layers(name), name))
        shadows = f" (and shadows the shipped recipe {shipped})" if shipped else ""
        if added:
            raise AlreadyExists(f"image {name} already exists, with {added} layer"
                                f"{'s' * (added > 1)} `image shell` added: --force replaces "
                                f"it and drops them, --update imports under them{shadows}")
        raise AlreadyExists(f"image {name} already exists: --force replaces it{shadows}")
    if folder.exists():
        raise AlreadyExists(f"image {name} is not built but has a recipe folder, {folder}: "
                            "--force replaces it")
    if shipped:
        raise AlreadyExists(f"image {name} has a shipped recipe, {shipped}: an import would "
                            f"shadow it (until {folder} is removed); --force imports anyway")


def _shadowed_by_import(config: Config, name: str) -> Path | None:
    """The recipe of the name the one an import writes (`<state>/recipes/NAME`) would
    shadow: a shipped one, found after it on the search path."""
    target = Layout.of(config).recipe_dir(name).parent
    after = False
    for folder in recipe_search_path(config):
        path = Path(folder) / name / RECIPE_FILE
        if after and path.is_file():
            return path
        after = after or Path(folder) == target
    return None


def _refuse_shadowed(config: Config, name: str) -> None:
    """Conflict when a recipe of the name is found before the one the import writes (a
    folder of the settings' image_dirs): the build made that recipe's image instead."""
    target = Layout.of(config).recipe_dir(name)
    for folder in recipe_search_path(config):
        if Path(folder) == target.parent:
            return
        path = Path(folder) / name / RECIPE_FILE
        if path.is_file():
            raise Conflict(f"image {name}: the recipe {path} shadows the one an import "
                           f"writes ({target}): import under another name")


def _stage(config: Config, source: str, folder: Path, kernel_args: list[str], init: str,
           access: registry.Access | None, progress) -> None:
    """The image and its generated recipe in a folder of their own."""
    folder.mkdir(parents=True)
    if source.startswith(("docker://", "oci:")):
        target = folder / IMPORTED_LAYOUT
        writer = LayoutWriter(target, lambda digest: _kept_blob(config, digest))
        if source.startswith("docker://"):
            registry.pull(registry.parse_reference(source), writer, access,
                          progress or (lambda event: None))
        else:
            copy_layout(source[len("oci:"):], writer)
    else:
        archive = Path(source)
        if not archive.exists():
            raise InvalidInput(f"no such archive: {archive} (or docker://REGISTRY/REPO:TAG, "
                               "oci:DIR[:TAG])")
        target = folder / (IMPORTED_LAYOUT if archive.is_dir() else IMPORTED_ARCHIVE)
        if archive.is_dir():
            _no_links_out(archive)
            shutil.copytree(archive, target)
        else:
            shutil.copyfile(archive, target)
    recipe = {"description": f"imported from {source}", "init": init,
              "kernel_args": kernel_args, "layers": [{"kind": "oci-archive", "path": target.name}]}
    write_atomic(folder / RECIPE_FILE, yaml.safe_dump(recipe, sort_keys=False))


def _no_links_out(folder: Path) -> None:
    """An archive folder's symlinks stay inside it: the copy follows them, and one to a host
    file (/etc/shadow) made that file's content a layer, as root, of an image every node is
    served."""
    top = folder.resolve()
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() and not path.resolve().is_relative_to(top):
            raise InvalidInput(f"{folder}: {path.relative_to(folder)} links outside the "
                               "archive folder; copy what it names into the folder")


def _kept_blob(config: Config, digest: str) -> Path | None:
    """A blob an earlier import already holds (re-imports and shared base layers are not
    downloaded again); LayoutWriter checks its size and digest before it links one in."""
    hexdigest = digest.split(":", 1)[1]
    for path in sorted(Layout.of(config).recipes.glob(f"*/oci/blobs/sha256/{hexdigest}")):
        return path
    return None


__all__ = ["blob_path", "build_image", "collect_garbage", "delete_image", "import_image",
           "list_images", "load_manifest", "load_recipe", "OverExisting", "RecipeError"]
