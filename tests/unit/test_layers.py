"""The import direction of STYLE.md, checked by import-linter's layers contract."""

import subprocess
from pathlib import Path

from tests.tools import command

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".import_linter_cache"


def test_imports_follow_the_data_flow():
    had_cache = CACHE.exists()
    lint = command(["lint-imports", "--no-cache", "--config", str(REPO / "pyproject.toml")])
    result = subprocess.run(lint, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout
    assert had_cache or not CACHE.exists(), "the check left .import_linter_cache in the tree"
