"""SSH host keys made once per session and copied into each test's state dir: RSA key
generation costs seconds on a busy 2-core machine."""

from __future__ import annotations

import shutil

import pytest

from provisiond.config import Config
from provisiond.overlays.hostkeys import ensure_host_keys, host_key_dir

NODES = ("n1", "n2", "n3")


@pytest.fixture(scope="session")
def _key_template(tmp_path_factory):
    config = Config(state_dir=tmp_path_factory.mktemp("keys"))
    for node in NODES:
        ensure_host_keys(config, node)
    return host_key_dir(config, NODES[0]).parent


@pytest.fixture(autouse=True)
def _prekeyed(state_dir, _key_template):
    target = state_dir / "secrets" / "ssh-host-keys"
    shutil.copytree(_key_template, target)
    target.parent.chmod(0o700)
