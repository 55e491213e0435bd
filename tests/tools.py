"""Where tests and benchmarks find the programs they run: this interpreter's bin dir (the
venv's console scripts: vbmcd, vbmc, sushy-emulator...) or Debian's, never whatever PATH the
caller happens to have (a fresh shell's PATH does not hold .venv/bin)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent  # not resolved: .venv/bin/python is a symlink
SEARCH_PATH = os.pathsep.join([str(VENV_BIN), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def tool(name: str) -> str | None:
    """Absolute path of program `name` in the venv or an apt directory, or None."""
    return shutil.which(name, path=SEARCH_PATH)


def command(argv: list[str]) -> list[str]:
    """`argv` with its program made absolute; a missing program is FileNotFoundError."""
    path = tool(argv[0])
    if path is None:
        raise FileNotFoundError(f"{argv[0]}: not in {SEARCH_PATH}")
    return [path, *argv[1:]]


SHARED_CACHE = "/var/tmp/provisiond-test-cache"
TINY_DEBS = ("busybox-static", "linux-image-amd64")


def private_deb_cache(folder: Path) -> Path:
    """`folder` made a PROVISIOND_CACHE_DIR holding only the tiny image's downloaded .debs
    (hard links into the machine-wide download cache, fetched there once), so a build with
    it really unpacks them instead of reusing cached layer trees."""
    from provisiond.config import load_config, write_default_config
    from provisiond.images.debs import deb_sha256, fetch_deb

    shared = Path(os.environ.get("PROVISIOND_CACHE_DIR") or SHARED_CACHE)
    old = os.environ.get("PROVISIOND_CACHE_DIR")
    os.environ["PROVISIOND_CACHE_DIR"] = str(shared)
    try:
        probe = folder / "probe"
        write_default_config(probe)
        for package in TINY_DEBS:
            deb_sha256(fetch_deb(load_config(probe), package))
    finally:
        if old is None:
            os.environ.pop("PROVISIOND_CACHE_DIR")
        else:
            os.environ["PROVISIOND_CACHE_DIR"] = old
    shutil.rmtree(folder / "probe")
    (folder / "debs").mkdir(parents=True)
    for path in (shared / "debs").iterdir():
        if path.name.endswith((".deb", ".sha256", ".json")):
            _link_or_copy(path, folder / "debs" / path.name)
    return folder


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
