"""The import direction of STYLE.md, checked by import-linter's layers contract."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".import_linter_cache"


def test_imports_follow_the_data_flow():
    lint = Path(sys.executable).parent / "lint-imports"  # the venv's, never PATH's
    assert lint.is_file(), f"{lint} is missing: run .ci/install-deps.sh"
    had_cache = CACHE.exists()
    result = subprocess.run([str(lint), "--no-cache", "--config", str(REPO / "pyproject.toml")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout
    assert had_cache or not CACHE.exists(), "the check left .import_linter_cache in the tree"
