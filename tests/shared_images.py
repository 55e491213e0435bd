"""Images built once per test session and shared: the debian12 build (slow: debootstrap and
the Debian kernel) is made once, checked by tests/integration/test_images_debian.py, and its
layer cache copied into the VM lab's state dir, whose builds then reuse every layer it has.

A layer's cache key hashes what the layer is made from (recipe step, inputs, parent key),
not the state dir, so a copied record, tree and blobs are what a build there would make."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from provisiond.config import Config, load_config, write_default_config
from provisiond.images import build_image

SHARED_DEB_CACHE = "/var/tmp/provisiond-test-cache"  # .debs, kept between runs


def build_shared(state: Path, image: str) -> tuple[Config, dict, float]:
    """`image` built in a new state dir (its .debs from the shared cache); (config,
    manifest, seconds)."""
    old = os.environ.get("PROVISIOND_CACHE_DIR")
    os.environ["PROVISIOND_CACHE_DIR"] = old or SHARED_DEB_CACHE
    try:
        write_default_config(state)
        config = load_config(state)
        started = time.monotonic()
        manifest = build_image(config, image)
        return config, manifest, time.monotonic() - started
    finally:
        if old is None:
            del os.environ["PROVISIOND_CACHE_DIR"]


def seed_layer_cache(source: Config, target_state_dir: Path) -> int:
    """Copy the built layers (records, trees, mounted forms) and blobs of `source` into
    another state dir, keeping owners, modes and extended attributes; returns how many layer
    records it has now. Nothing there is overwritten (cp -n): a layer the target built
    already stays as it is."""
    copied = 0
    for sub in ("cache/layers", "blobs/sha256"):
        origin, into = source.state_dir / sub, target_state_dir / sub
        if not origin.is_dir():
            continue
        into.mkdir(parents=True, exist_ok=True)
        entries = [str(p) for p in origin.iterdir()
                   if p.name != "locks" and not p.name.startswith(("shell-", "."))
                   and not p.name.endswith((".tmp", ".work"))]
        if entries:
            subprocess.run(["cp", "-a", "-n", "--reflink=auto", *entries, str(into)],
                           check=True)
        copied = len(list(into.glob("*.json"))) if sub == "cache/layers" else copied
    return copied
