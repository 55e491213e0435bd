"""`build_image`: plan a recipe's layers, reuse the cached ones, build the rest, take the
kernel out of the result and write the manifest last (a failure leaves the old one)."""

from __future__ import annotations

import contextlib
import datetime
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from provisiond.atomic import locked
from provisiond.config import Config
from provisiond.errors import BuildFailed, InUse, ProvisiondError
from provisiond.events import build_events
from provisiond.images import chroot, oci, squash, steps
from provisiond.images.blobs import store_file
from provisiond.images.kernel import KERNEL_RE
from provisiond.images.layers import (LayerPlan, build_layer, cached_layer, layer_key,
                                      shell_mounting)
from provisiond.images.manifests import gc_lock, image_generation, lock_path, save_manifest
from provisiond.images.recipe import Recipe, Step, find_recipe, load_recipe
from provisiond.images.swap import end_swap, swapped_out
from provisiond.state.layout import Layout

Progress = Callable[[dict], None]


def build_image(config: Config, name: str, progress: Progress | None = None,
                rebuild: bool = False, lock_held: bool = False, replace: bool = False) -> dict:
    """Build (or reuse) every layer of recipe `name` and publish its manifest.

    `rebuild` ignores the layer cache (e.g. to pick up a newer mirror for debootstrap).
    `lock_held`: the caller holds the image's lock (`image shell`, whose check that the
    image is still there, listing of its layer and rebuild go as one; `image import`).
    `replace`: the build replaces the image (`image import --force`): a new generation,
    without the layers `image shell` added to the one replaced (the import drops them once
    the manifest is saved)."""
    chroot.require_build_privileges()
    started = time.monotonic()
    with build_events(config, f"image/{name}", {"what": "image", "name": name}) as outcome:
        if not swapped_out(config, name):  # (then end_swap puts its recipe folder back)
            find_recipe(config, name)  # a bad or unknown name: refused before the lock is made
        # the recipe and shell.json read under the lock: a build that waited for a shell's
        # exit or an import's swap builds what they left, not what was there before
        held = contextlib.nullcontext() if lock_held else _locked_and_swap_ended(config, name)
        with held, locked(gc_lock(config), shared=True):
            recipe = load_recipe(config, name, shell_layers=not replace)
            compression = recipe.compression or config.build.compression
            records = _build_layers(config, recipe, compression,
                                    progress or (lambda e: None), rebuild)
            kernel = _store_kernel(config, recipe, records)
            mounted = squash.mounted_layers(config, records, kernel["version"], recipe.boot)
            manifest = _manifest(recipe, records, kernel, time.monotonic() - started)
            manifest["mounted"] = mounted
            manifest["generation"] = _generation(config, name, replace)
            save_manifest(config, manifest)
        outcome.update(layers=len(records), size=manifest["total_size"],
                       seconds=manifest["build_seconds"])
    return manifest


@contextlib.contextmanager
def _locked_and_swap_ended(config: Config, name: str) -> Iterator[None]:
    """The image's lock, and the recipe folder swap of an import killed outright ended
    (provisiond.images.swap): the build makes the image's recipe, not a half-done import."""
    with locked(lock_path(config, name)):
        end_swap(config, name)
        yield


def _generation(config: Config, name: str, replace: bool) -> str:
    """The image's generation, kept by a rebuild; a new one for a first build, the first
    after a delete, or a replacement: an `image shell` session adds its layer only to the
    generation it opened, not to an image deleted and built again meanwhile, of another
    recipe perhaps. A manifest written before generations has none (""), and a rebuild
    keeps that too: a new one would tell a session open on it that its image was
    replaced."""
    current = None if replace else image_generation(config, name)
    return secrets.token_hex(8) if current is None else current


@contextlib.contextmanager
def interrupt_on_term() -> Iterator[None]:
    """A SIGTERM or a hangup (a dropped ssh session) stops a build like Ctrl-C does:
    mounts and temp trees are cleaned up, an import undone (a hangup's default ended the
    process at once, an import's recipe folder swapped, a build's mounts in place)."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = {signum: signal.signal(signum, raise_interrupt)
                    for signum in (signal.SIGTERM, signal.SIGHUP)}
    except ValueError:  # not the main thread (e.g. the CLI run inside a server)
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def plan_layers(config: Config, recipe: Recipe, compression: str) -> list[LayerPlan]:
    """Every layer of the recipe with its cache key, parents first."""
    plans: list[LayerPlan] = []
    for step in recipe.steps:
        parent = plans[-1].key if plans else None
        try:
            plans.extend(_plan_step(config, step, parent, compression))
        except ProvisiondError as exc:
            raise BuildFailed(_name_step(step, exc)) from None
    return plans


def _plan_step(config: Config, step: Step, parent: str | None, compression: str
               ) -> list[LayerPlan]:
    if step.kind == "oci-archive":
        return oci.plan_archive(step, parent, compression)
    if step.kind == "tar":
        return oci.plan_tar(step, parent, compression)
    entry = step.layer.model_dump(exclude={"description"})
    key = layer_key(parent, step.kind, entry, steps.step_inputs(config, step), compression)
    description = step.layer.description or f"{step.recipe}#{step.index} {step.kind}"
    tidy = steps.drop_volatile if step.kind in steps.TIDIED else None
    if step.layer.kind in ("busybox", "debootstrap", "directory"):
        return [LayerPlan(key, step.kind, description, _base_maker(config, step), tidy=tidy)]
    return [LayerPlan(key, step.kind, description, _step_maker(config, step), tidy=tidy)]


def _base_maker(config: Config, step: Step):
    return lambda root: steps.build_base(config, step, root, _log(config, step.recipe))


def _step_maker(config: Config, step: Step):
    return lambda root: steps.apply_step(config, step, root, _log(config, step.recipe))


def _log(config: Config, recipe: str) -> Path:
    path = Layout.of(config).build_log(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _build_layers(config: Config, recipe: Recipe, compression: str,
                  progress: Progress, rebuild: bool) -> list[dict]:
    plans = plan_layers(config, recipe, compression)
    records: list[dict] = []
    for index, plan in enumerate(plans, 1):
        event = {"image": recipe.name, "index": index, "count": len(plans),
                 "kind": plan.kind, "description": plan.description, "key": plan.key}
        records.append(_one_layer(config, plan, records, compression, progress, event,
                                  rebuild))
    return records


def _one_layer(config: Config, plan: LayerPlan, parents: list[dict], compression: str,
               progress: Progress, event: dict, rebuild: bool) -> dict:
    with locked(Layout.of(config).layer_lock(plan.key)):
        record = None if rebuild else cached_layer(config, plan.key)
        if record is not None:
            progress({**event, "status": "cached", "size": record["size"], "seconds": 0.0})
            return record
        _refuse_if_mounted(config, plan.key, event)
        progress({**event, "status": "building"})
        try:
            record = build_layer(config, plan, parents, compression,
                                 _log(config, event["image"]))
        except ProvisiondError as exc:
            raise BuildFailed(_name_layer(event, exc)) from None
        except OSError as exc:
            raise BuildFailed(_name_layer(event, f"{exc.strerror or exc}: {exc.filename}")
                              ) from None
    progress({**event, "status": "built", "size": record["size"],
              "seconds": record["build_seconds"]})
    return record


def _refuse_if_mounted(config: Config, key: str, event: dict) -> None:
    """InUse when an open `image shell` session mounts the layer's tree, which building
    it again (--no-cache, or its blob gone) would remove from under the session."""
    layout = Layout.of(config)
    if layout.layer_tree(key).is_dir() and (holder := shell_mounting(layout, key)):
        raise InUse(_name_layer(event, f"{holder} has its layer tree mounted: try again "
                                       "when that shell has ended"))


def _name_layer(event: dict, exc) -> str:
    text = str(exc)
    where = f"image {event['image']}: layer {event['index']} ({event['kind']})"
    return text if text.startswith("recipe ") else f"{where}: {text}"


def _name_step(step: Step, exc: ProvisiondError) -> str:
    text = str(exc)
    return text if text.startswith("recipe ") else f"{step.where}: {text}"


def _store_kernel(config: Config, recipe: Recipe, records: list[dict]) -> dict:
    """The newest /boot/vmlinuz-* of the finished image, stored as its own blob."""
    layout = Layout.of(config)
    trees = [layout.layer_tree(r["key"]) for r in reversed(records)]
    view = layout.layers / f"view-{recipe.name}"  # a mount point, gone after
    with chroot.overlay(trees, None, view / "w", view / "merged") as merged:
        kernels = sorted((merged / "boot").glob("vmlinuz-*")) if (merged / "boot").is_dir() else []
        if not kernels:
            raise BuildFailed(f"recipe {recipe.name}: the image has no /boot/vmlinuz-*")
        digest, size = store_file(config, kernels[-1])
    version = KERNEL_RE.match(f"boot/{kernels[-1].name}").group(1)
    with contextlib.suppress(OSError):
        view.joinpath("merged").rmdir()
        view.rmdir()
    return {"digest": digest, "size": size, "version": version}


def _manifest(recipe: Recipe, records: list[dict], kernel: dict, seconds: float) -> dict:
    layers = [{k: r[k] for k in ("digest", "size", "key", "kind", "compression",
                                 "description")} for r in records]
    return {
        "name": recipe.name,
        "kernel": kernel,
        "layers": layers,
        "kernel_args": recipe.kernel_args,
        "init": recipe.init,
        "recipe": {"path": str(recipe.path), "sha256": recipe.sha256},
        "built_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "build_seconds": round(seconds, 3),
        "total_size": kernel["size"] + sum(r["size"] for r in records),
        "layer_build_seconds": [r.get("build_seconds", 0.0) for r in records],
    }
