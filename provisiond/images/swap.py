"""An import's swap of an image's recipe folder (`<state>/recipes/<name>/`) for the one it
staged, and the end of that swap: undone when the import saved no manifest, finished
(the previous folder removed; for `--force`, the replaced image's shell layers dropped)
when it did.

The folder swapped in carries a mark (`.import.json`) until the swap is ended, saying
which manifest revision the import started from and whether it replaces the image: an
import killed outright (SIGKILL, the OOM killer, a power cut) left the swapped folder as
the image's recipe, which the next build made (under the replaced image's shell layers,
for --force), and the previous folder aside, where the next import removed it. Whoever
next holds the image's lock (a build, an `image shell`'s exit, an import) ends it first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from provisiond.atomic import write_atomic
from provisiond.config import Config
from provisiond.images.manifests import drop_shell_layers, manifest_revision
from provisiond.images.recipe import check_image_name
from provisiond.state.layout import Layout


def swap_in(config: Config, name: str, staged: Path, replace: bool) -> int | None:
    """Under the image's lock: the staged folder becomes the image's recipe folder, the
    previous one put aside; returns the manifest revision the import starts from."""
    layout = Layout.of(config)
    folder, previous = layout.recipe_dir(name), layout.recipe_aside(name, "previous")
    before = manifest_revision(config, name)
    write_atomic(staged / layout.recipe_swap_mark(name).name,
                 json.dumps({"revision": before, "replace": replace}))
    if folder.exists():
        folder.rename(previous)
    staged.rename(folder)
    return before


def end_swap(config: Config, name: str) -> None:
    """Under the image's lock: end the swap an import left (one killed, or this one's):
    the previous folder back when no manifest was saved since, else the import finished.
    Nothing to do when there is none."""
    layout = Layout.of(config)
    folder = layout.recipe_dir(name)
    previous, failed = layout.recipe_aside(name, "previous"), layout.recipe_aside(name, "failed")
    mark = _read_mark(layout.recipe_swap_mark(name))
    saved = mark is not None and manifest_revision(config, name) not in (None,
                                                                          mark["revision"])
    if mark is not None and not saved:
        folder.rename(failed)
    if not folder.exists() and previous.exists():  # (also: killed between the two renames)
        previous.rename(folder)
    if saved:
        if mark["replace"]:
            drop_shell_layers(config, name)  # the replaced image's, once it is saved
        layout.recipe_swap_mark(name).unlink()
    for aside in (previous, failed):
        shutil.rmtree(aside, ignore_errors=True)


def swapped_out(config: Config, name: str) -> bool:
    """An import killed outright left the image's previous recipe folder aside (its own
    may not be in place yet)."""
    check_image_name(name)
    return Layout.of(config).recipe_aside(name, "previous").is_dir()


def _read_mark(path: Path) -> dict | None:
    """The mark of a folder an import swapped in, or None (none, or not one we wrote)."""
    try:
        mark = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("replace"), bool) or not (
            mark.get("revision") is None or isinstance(mark.get("revision"), int)):
        return None
    return mark
