"""Image recipes: `images/<name>/image.yaml`, an ordered list of layers, validated.

A recipe's first layer is a base (busybox, debootstrap, oci-archive, a directory, or
another image of ours); the layers after it add packages, copy files or run commands in a
chroot. An `image` base expands into the parent recipe's layers, so parent and child share
their layer blobs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from provisiond.config import Config
from provisiond.documents import load_yaml_mapping
from provisiond.errors import InvalidInput, NotFound
from provisiond.inventory.values import check_image_name as _image_name_rule
from provisiond.state.layout import Layout, recipe_search_path
from provisiond.state.models import ShellLayer, ShellLayers

RECIPE_FILE = "image.yaml"
DEFAULT_MODULES = ["virtio_net", "virtio_pci", "virtio_blk", "e1000", "af_packet"]


class RecipeError(InvalidInput):
    """A recipe cannot be used as written."""


class RecipeNotFound(NotFound):
    """No recipe folder has the given image name."""


class _Layer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""


class BusyboxLayer(_Layer):
    kind: Literal["busybox"]
    package: str = "busybox-static"
    kernel: str | None = "linux-image-amd64"
    modules: list[str] | Literal["all"] = DEFAULT_MODULES


class DebootstrapLayer(_Layer):
    kind: Literal["debootstrap"]
    suite: str = "bookworm"
    variant: str = "minbase"
    components: list[str] = ["main"]
    packages: list[str] = []
    mirror: str | None = None


class OciLayer(_Layer):
    kind: Literal["oci-archive"]
    path: str


class DirectoryLayer(_Layer):
    kind: Literal["directory"]
    path: str


class ImageLayer(_Layer):
    kind: Literal["image"]
    name: str


class PackagesLayer(_Layer):
    kind: Literal["packages"]
    install: list[str] = []
    purge: list[str] = []


class CopyItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    src: str
    dest: str
    mode: str | None = None


class CopyLayer(_Layer):
    kind: Literal["copy"]
    files: list[CopyItem]


class RunLayer(_Layer):
    kind: Literal["run"]
    commands: list[str]


class TarLayer(_Layer):
    """A layer tarball in the OCI layer format (`.wh.` whiteouts), e.g. an image shell's."""

    kind: Literal["tar"]
    path: str


LAYER_MODELS = {m.model_fields["kind"].annotation.__args__[0]: m for m in (
    BusyboxLayer, DebootstrapLayer, OciLayer, DirectoryLayer, ImageLayer, PackagesLayer,
    CopyLayer, RunLayer, TarLayer)}
BASE_KINDS = {"busybox", "debootstrap", "oci-archive", "directory", "image"}


@dataclass
class Step:
    """One layer to build: its validated entry and where it came from."""

    recipe: str
    index: int
    layer: _Layer
    folder: Path

    @property
    def kind(self) -> str:
        return self.layer.kind

    @property
    def where(self) -> str:
        return f"recipe {self.recipe}: layer {self.index} ({self.kind})"


@dataclass
class Recipe:
    name: str
    path: Path
    sha256: str
    steps: list[Step]
    kernel_args: list[str] = field(default_factory=list)
    init: str = "/sbin/init"
    compression: str | None = None
    boot: str | None = None  # mounted | unpacked (provisiond.images.squash)


class _RecipeHead(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    kernel_args: list[str] | None = None
    init: str | None = None
    compression: Literal["zstd", "gzip"] | None = None
    boot: Literal["mounted", "unpacked"] | None = None
    layers: list[dict]


def check_image_name(name: str) -> str:
    """inventory.model's image name rule (a DNS label), as InvalidInput: one rule for
    recipes, builds, imports and the inventory."""
    try:
        return _image_name_rule(name)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def find_recipe(config: Config, name: str) -> Path:
    """The first `<dir>/<name>/image.yaml` on the recipe search path."""
    check_image_name(name)
    for folder in recipe_search_path(config):
        path = Path(folder) / name / RECIPE_FILE
        if path.is_file():
            return path
    searched = ", ".join(str(d) for d in recipe_search_path(config))
    raise RecipeNotFound(f"no recipe for image {name!r} (searched {searched})")


def load_recipe(config: Config, name: str, _seen: tuple[str, ...] = (),
                shell_layers: bool = True) -> Recipe:
    """Read and validate a recipe, expanding an `image` base into its parent's layers;
    the layers `image shell` added to the image after them, unless `shell_layers` is
    False (an import replacing the image)."""
    if name in _seen:
        raise RecipeError(f"recipe {name}: parent images form a loop: {' -> '.join(_seen)}")
    path = find_recipe(config, name)
    raw = path.read_bytes()
    head = _parse_head(name, path, raw)
    if not head.layers:
        raise RecipeError(f"recipe {name} ({path}): layers: the list is empty")
    recipe = Recipe(name, path, hashlib.sha256(raw).hexdigest(), [])
    for index, entry in enumerate(head.layers, 1):
        step = Step(name, index, _parse_layer(name, index, entry), path.parent)
        _check_position(step)
        if step.kind == "image":
            parent = load_recipe(config, step.layer.name, (*_seen, name))
            recipe.steps.extend(parent.steps)
            recipe.kernel_args, recipe.init = parent.kernel_args, parent.init
            recipe.compression, recipe.boot = parent.compression, parent.boot
        else:
            recipe.steps.append(step)
    _apply_head(recipe, head)
    if not _seen and shell_layers:  # an image's shell layers are its own, not its children's
        recipe.steps.extend(shell_steps(config, name, len(recipe.steps)))
    return recipe


def shell_steps(config: Config, name: str, before: int) -> list[Step]:
    """The `tar` layers `image shell` added to image `name`, after its recipe's layers."""
    listing = Layout.of(config).image_shell_layers(name)
    return [Step(name, before + number, TarLayer(kind="tar", **entry.document()),
                 listing.parent)
            for number, entry in enumerate(read_shell_layers(listing, name), 1)]


def tar_layer_files(config: Config) -> set[Path]:
    """The files the `tar` layers of the recipes on the search path name, resolved as a
    build resolves them (an admin told to add a kept `image shell` tarball to a recipe
    may name it where it is). A recipe that cannot be read names none."""
    found = set()
    for folder in recipe_search_path(config):
        for path in sorted(Path(folder).glob(f"*/{RECIPE_FILE}")):
            try:
                head = _parse_head(path.parent.name, path, path.read_bytes())
            except (RecipeError, OSError):
                continue
            found |= {(path.parent / entry["path"]).resolve() for entry in head.layers
                      if isinstance(entry, dict) and entry.get("kind") == "tar"
                      and isinstance(entry.get("path"), str)}
    return found


def read_shell_layers(listing: Path, name: str) -> list[ShellLayer]:
    """The entries of image `name`'s shell.json (none when it is missing); RecipeError,
    one line, when it cannot be read."""
    try:
        return ShellLayers.model_validate_json(listing.read_bytes()).root
    except FileNotFoundError:
        return []
    except ValidationError as exc:  # not JSON too
        raise RecipeError(f"image {name}: {listing} is unreadable: {_first_error(exc)}"
                          ) from None
    except OSError as exc:
        raise RecipeError(f"image {name}: {listing} is unreadable: {exc.strerror or exc}"
                          ) from None


def _parse_head(name: str, path: Path, raw: bytes) -> _RecipeHead:
    data = load_yaml_mapping(raw, f"recipe {name} ({path})", RecipeError)
    try:
        return _RecipeHead.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"recipe {name} ({path}): {_first_error(exc)}") from None


def _parse_layer(name: str, index: int, entry) -> _Layer:
    kind = entry.get("kind") if isinstance(entry, dict) else None
    model = LAYER_MODELS.get(kind)
    if model is None:
        known = ", ".join(sorted(LAYER_MODELS))
        raise RecipeError(f"recipe {name}: layer {index}: unknown kind {kind!r} "
                          f"(known: {known})")
    try:
        return model.model_validate(entry)
    except ValidationError as exc:
        raise RecipeError(f"recipe {name}: layer {index} ({kind}): "
                          f"{_first_error(exc)}") from None


def _check_position(step: Step) -> None:
    if step.index == 1 and step.kind not in BASE_KINDS:
        raise RecipeError(f"{step.where}: the first layer must be a base "
                          f"({', '.join(sorted(BASE_KINDS))})")
    if step.index > 1 and step.kind in BASE_KINDS:
        raise RecipeError(f"{step.where}: a base kind can only be the first layer")


def _apply_head(recipe: Recipe, head: _RecipeHead) -> None:
    if head.kernel_args is not None:
        recipe.kernel_args = head.kernel_args
    if head.init is not None:
        recipe.init = head.init
    if head.compression is not None:
        recipe.compression = head.compression
    if head.boot is not None:
        recipe.boot = head.boot


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]
