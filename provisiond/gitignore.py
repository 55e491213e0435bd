"""The state directory's `.gitignore`, for sites that keep the state dir in git: what a
site writes (provisiond.yaml, inventory.yaml, recipes/, overlays/, discovery/rules.yaml)
stays in; what provisiond derives, builds, downloads or records, and every secret, stays
out. `provisiond init` writes it once; an existing `.gitignore` is the site's and is kept.

The entries are the state layout's own paths (provisiond.state.layout), anchored at the
state dir with a leading `/`, so a file of that name inside an overlay is not ignored.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path, PurePath

from provisiond.atomic import fsync_dir
from provisiond.state.layout import KEYS, Layout

GITIGNORE_NAME = ".gitignore"


def _anchored(*paths: PurePath, folder: bool = False) -> list[str]:
    return [f"/{path.as_posix()}{'/' if folder else ''}" for path in paths]


SECTIONS: list[tuple[str, list[str]]] = [
    ("derived from inventory.yaml, and the files store's revisions",
     _anchored(KEYS.inventory_cache, KEYS.inventory_claims)
     + _anchored(KEYS.files_store, folder=True)),
    ("secrets: BMC passwords, node secrets and host keys, API tokens, the store's key",
     _anchored(KEYS.secrets, KEYS.tokens, KEYS.store_key)
     + _anchored(KEYS.token_key.parent, folder=True)),
    ("downloads, blobs, image and overlay builds: made again from recipes and overlays\n"
     "(the layers `image shell` added are under images/: copy them into a recipe to keep "
     "them);\nan import's folders while it runs",
     _anchored(KEYS.cache, KEYS.blobs.parent, KEYS.images, KEYS.overlay_builds, folder=True)
     + _anchored(KEYS.recipe_aside("*", "*"), folder=True)
     + _anchored(KEYS.recipe_swap_mark("*"))),
    ("the images `image import` keeps in its recipes (large): they come back with\n"
     "`image import` from the source the recipe's description names",
     _anchored(KEYS.recipe_imported_layout("*"), folder=True)
     + _anchored(KEYS.recipe_imported_archive("*"))),
    ("what the servers and commands record",
     _anchored(KEYS.status_dir, KEYS.facts("-").parent, KEYS.fake_bmcs.parent,
               KEYS.events.parent, KEYS.audit.parent, KEYS.jobs, KEYS.run, KEYS.slurm,
               folder=True)
     + _anchored(KEYS.leases, KEYS.sightings, KEYS.older_sightings, KEYS.machines,
                 KEYS.metrics)),
    ("locks, and the copies a schema migration keeps (git has the history)",
     ["/*.lock", f"/{KEYS.discovery.as_posix()}/*.lock", "/*.schema-*.bak"]),
]


def gitignore_text() -> str:
    lines = ["# provisiond: what a state dir kept in git must not hold (written by",
             "# `provisiond init`, which never overwrites this file; edit it as you like)."]
    for what, patterns in SECTIONS:
        lines += ["", *(f"# {line}" for line in what.splitlines()), *patterns]
    return "\n".join(lines) + "\n"


def write_gitignore(layout: Layout) -> Path | None:
    """Write the state dir's `.gitignore` unless one exists; its path, or None when kept.
    Written whole to a temp file, then linked to its name: never half a file, and never
    over one (made meanwhile, too)."""
    path = Path(layout.root) / GITIGNORE_NAME
    if os.path.lexists(path):
        return None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(gitignore_text())
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.link(tmp, path)
    except FileExistsError:
        return None
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return path
