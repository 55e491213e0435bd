"""Golden files: every shipped overlay rendered for the fixture inventory must match
tests/fixtures/overlays/golden/<node>/<overlay>/ byte for byte (and its entry list: paths,
modes, symlink targets). Regenerate after an intended change with
`PROVISIOND_UPDATE_GOLDEN=1 pytest tests/unit/overlays/test_golden.py`."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from provisiond.config import SHIPPED_DIR, load_config
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.render import Builder
from provisiond.overlays.source import list_overlay_dirs, load_overlay

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "overlays"
GOLDEN = FIXTURES / "golden"
NODES = ["n001", "n002", "svc1"]
SHIPPED = sorted(p.name for p in (SHIPPED_DIR / "overlays").iterdir() if p.is_dir())
UPDATE = os.environ.get("PROVISIOND_UPDATE_GOLDEN") == "1"


class FixedSecretsBuilder(Builder):
    """Host keys are random; the golden files hold these stand-ins instead."""

    def secrets(self, node):
        keys = {t: {"private": f"PRIVATE {t} KEY OF {node}\n",
                    "public": f"ssh-{t} PUBLIC-{t}-{node} root@{node}\n"}
                for t in ("ed25519", "ecdsa")}
        return {"ssh_host_keys": keys, "munge.key": f"MUNGE-KEY-OF-{node}"}, f"fixed-{node}"


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    state = tmp_path_factory.mktemp("golden-state")
    for name in ("inventory.yaml", "provisiond.yaml", "slurm/slurm.conf"):
        (state / name).parent.mkdir(exist_ok=True)
        shutil.copy(FIXTURES / name, state / name)
    config = load_config(state)
    assert list_overlay_dirs(config)  # the shipped overlays are on the search path
    return FixedSecretsBuilder(config, take_snapshot(config, reuse=False))


def _listing(entries) -> str:
    lines = []
    for e in entries:
        target = f" -> {e.data.decode()}" if stat.S_ISLNK(e.mode) else ""
        lines.append(f"{e.mode:07o} {e.path}{target}")
    return "\n".join(lines) + "\n"


def _write_golden(folder: Path, entries, listing: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder.parent / f"{folder.name}.entries").write_text(listing)
    for e in entries:
        if stat.S_ISREG(e.mode):
            (folder / e.path).parent.mkdir(parents=True, exist_ok=True)
            (folder / e.path).write_bytes(e.data)


@pytest.mark.parametrize("node", NODES)
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_overlay_matches_golden(builder, node, name):
    overlay = load_overlay(builder.config, name)
    kind = "runtime" if overlay.secret else "system"
    entries = builder.render(overlay, node, kind)
    listing = _listing(entries)
    folder = GOLDEN / node / name
    if UPDATE:
        _write_golden(folder, entries, listing)
    assert (folder.parent / f"{name}.entries").read_text() == listing
    for e in entries:
        if stat.S_ISREG(e.mode):
            assert (folder / e.path).read_bytes() == e.data, f"{node}/{name}/{e.path}"


def test_every_shipped_overlay_has_golden_files():
    for node in NODES:
        for name in SHIPPED:
            assert (GOLDEN / node / f"{name}.entries").is_file(), f"{node}/{name}"
