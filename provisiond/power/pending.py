"""Boot-device resets owed to BMCs without one-time boot (`bmc.boot_once: false`).

Such a node gets a persistent PXE override; the reset to disk is written here and done
once the node reports `ready` from a boot that started after the override was set.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.states import NodePhase
from provisiond.status import read_status


def pending_path(config: Config) -> Path:
    return config.state_dir / "power" / "pending-bootdev.json"


def read_pending(config: Config) -> dict[str, dict]:
    """node -> {"device": "disk", "since": epoch seconds}."""
    try:
        return json.loads(pending_path(config).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def add_pending(config: Config, node: str) -> None:
    _change(config, node, {"device": "disk", "since": time.time()})


def clear_pending(config: Config, node: str) -> None:
    _change(config, node, None)


def due_for_reset(config: Config, node: str) -> bool:
    """True once the node is ready from a boot newer than its persistent PXE override."""
    entry = read_pending(config).get(node)
    status = read_status(config, node) or {}
    return bool(entry) and status.get("phase") == NodePhase.READY.value \
        and status.get("boot_started", 0) >= entry["since"]


def _change(config: Config, node: str, entry: dict | None) -> None:
    path = pending_path(config)
    with locked(path.with_suffix(".lock")):
        data = read_pending(config)
        if entry is None and node not in data:
            return
        if entry is None:
            data.pop(node)
        else:
            data[node] = entry
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
