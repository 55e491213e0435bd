"""Node boot phases as reported by the servers and the node agent.

One small JSON file per node under `<state>/status/`, replaced atomically under a lock, so
DHCP, every HTTP worker and the CLI can share it without a database. A `dhcp` phase starts a
new boot and clears the previous boot's timestamps; the last refused provisioning token
(`token_refused`: time, reason, address) stays until a later one replaces it. Each phase
recorded is counted, and timed from its boot's dhcp phase (provisiond.metrics).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from provisiond.atomic import locked, read_json, write_atomic
from provisiond.config import Config
from provisiond.events import emit
from provisiond.metrics import observe_phase
from provisiond.states import NodePhase

REFUSAL = "token_refused"


def record_phase(config: Config, node: str, phase: NodePhase, detail: str = "",
                 memory: dict[str, int] | None = None) -> dict:
    """Note that `node` reached `phase` now (with the memory the agent reported, if any);
    returns the node's new status."""
    path = _status_path(config, node)
    now = time.time()
    with locked(path.with_suffix(".lock")):
        status = read_json(path)
        if phase is NodePhase.DHCP or "phases" not in status:
            kept = {k: status[k] for k in (REFUSAL,) if k in status}
            status = {"node": node, "boot_started": now, "phases": {}, **kept}
        status["phases"][phase.value] = now
        status["phase"] = phase.value
        status["updated"] = now
        status["detail"] = detail[:500]
        if memory:
            status["memory"] = memory
        write_atomic(path, json.dumps(status, sort_keys=True))
    emit(config, "node.phase", node, {"phase": phase.value, "detail": status["detail"]})
    dhcp = status["phases"].get(NodePhase.DHCP.value)
    observe_phase(phase.value, dhcp if isinstance(dhcp, (int, float)) else None, now)
    return status


def record_refusal(config: Config, node: str, data: dict) -> None:
    """Keep `data` (reason, address) as the node's last refused provisioning token."""
    path = _status_path(config, node)
    with locked(path.with_suffix(".lock")):
        status = read_json(path) or {"node": node}
        status[REFUSAL] = {"time": time.time(), **data}
        write_atomic(path, json.dumps(status, sort_keys=True))


def read_status(config: Config, node: str) -> dict | None:
    return read_json(_status_path(config, node)) or None


def read_all_status(config: Config) -> dict[str, dict]:
    result = {}
    if config.status_dir.is_dir():
        for path in config.status_dir.glob("*.json"):
            status = read_json(path)
            if status:
                result[path.stem] = status
    return result


def clear_status(config: Config, node: str) -> None:
    _status_path(config, node).unlink(missing_ok=True)


def _status_path(config: Config, node: str) -> Path:
    return config.status_dir / f"{node}.json"
