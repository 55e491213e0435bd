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
