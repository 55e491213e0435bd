"""Boot-device resets owed to BMCs without one-time boot (`bmc.boot_once: false`).

Such a node gets a persistent PXE override; the reset to disk is written here and done
once the node reports `ready` from a boot that started after the override was set.
"""

from __future__ import annotations

import time
from pathlib import Path

from provisiond.config import Config
from provisiond.state.layout import Layout
from provisiond.state.local import edited, read_json
from provisiond.state.models import NodeStatus, PendingBootdev, PendingBootdevs
from provisiond.states import BootDevice, NodePhase
from provisiond.status import read_status


def pending_path(config: Config) -> Path:
    return Layout.of(config).pending_bootdev


def read_pending(config: Config) -> dict[str, dict]:
    """node -> {"device": "disk", "since": epoch seconds} (PendingBootdev)."""
    return read_json(pending_path(config))


def add_pending(config: Config, node: str) -> None:
    entry = PendingBootdev(device=BootDevice.DISK, since=time.time())
    with edited(pending_path(config), **PendingBootdevs.FORMAT) as data:
        data[node] = entry.document()


def clear_pending(config: Config, node: str) -> None:
    with edited(pending_path(config), **PendingBootdevs.FORMAT) as data:
        data.pop(node, None)


def due_for_reset(config: Config, node: str) -> bool:
    """True once the node is ready from a boot newer than its persistent PXE override."""
    entry = read_pending(config).get(node)
    if not entry:
        return False
    status = NodeStatus.of(node, read_status(config, node))
    return status.reached(NodePhase.READY, PendingBootdev.model_validate(entry).since)
