"""Node boot phases as reported by the servers and the node agent.

One small JSON document per node, `status/<node>.json` on the store (provisiond.state: a file
under `<state>/status/` with the files store), changed by the store's compare-and-swap update,
so DHCP, every HTTP worker, the CLI and every boot server share it. A `dhcp` phase starts a
new boot and clears the previous boot's timestamps; the last refused provisioning token
(`token_refused`: time, reason, address) stays until a later one replaces it. Each phase
recorded is counted, and timed from its boot's dhcp phase (provisiond.metrics).
"""

from __future__ import annotations

import json
import time

from provisiond.config import Config
from provisiond.events import emit
from provisiond.metrics import observe_phase
from provisiond.state import open as opening
from provisiond.state.layout import KEYS
from provisiond.states import NodePhase

REFUSAL = "token_refused"
PREFIX = f"{KEYS.status_dir}/"


def record_phase(config: Config, node: str, phase: NodePhase, detail: str = "",
                 memory: dict[str, int] | None = None, at: float | None = None) -> dict:
    """Note that `node` reached `phase` now, or at `at` (a phase writer that lagged behind
    passes when the request came); with the memory the agent reported, if any. Returns the
    node's new status. The time is taken inside the update, so of two servers' phases for a
    node the one stored later also carries the later time; a phase from before the one
    stored (a lagging writer's, after the agent's own report) is kept in its boot's phases
    but does not replace the current phase, and is not announced."""
    late = False

    def change(status: dict) -> dict:
        nonlocal late
        now = time.time() if at is None else min(at, time.time())
        updated = status.get("updated")
        late = isinstance(updated, (int, float)) and now < updated \
            and isinstance(status.get("phases"), dict)
        if late:
            started = status.get("boot_started")
            if isinstance(started, (int, float)) and started <= now:
                status["phases"].setdefault(phase.value, now)
            return status
        if phase is NodePhase.DHCP or not isinstance(status.get("phases"), dict):
            kept = {k: status[k] for k in (REFUSAL,) if k in status}
            status = {"node": node, "boot_started": now, "phases": {}, **kept}
        status["phases"][phase.value] = now
        status["phase"] = phase.value
        status["updated"] = now
        status["detail"] = detail[:500]
        if memory:
            status["memory"] = memory
        return status

    status = _update(config, node, change)
    if late:
        return status
    emit(config, "node.phase", node, {"phase": phase.value, "detail": status["detail"]})
    dhcp = status["phases"].get(NodePhase.DHCP.value)
    observe_phase(phase.value, dhcp if isinstance(dhcp, (int, float)) else None,
                  status["updated"])
    return status


def record_refusal(config: Config, node: str, data: dict) -> None:
    """Keep `data` (reason, address) as the node's last refused provisioning token."""
    def change(status: dict) -> dict:
        return {**(status or {"node": node}), REFUSAL: {"time": time.time(), **data}}

    _update(config, node, change)


def read_status(config: Config, node: str) -> dict | None:
    entry = opening.open_store(config).get(status_key(node))
    return (_parse(entry.value) if entry else None) or None


def read_all_status(config: Config) -> dict[str, dict]:
    result = {}
    for entry in opening.open_store(config).list(PREFIX):
        name = entry.key[len(PREFIX):]
        status = _parse(entry.value)
        if status and name.endswith(".json") and "/" not in name:
            result[name[:-len(".json")]] = status
    return result


def clear_status(config: Config, node: str) -> None:
    opening.open_store(config).delete(status_key(node))


def status_key(node: str) -> str:
    return str(KEYS.status(node))


def _update(config: Config, node: str, change) -> dict:
    """Apply `change` (the stored status, {} if none or unreadable -> the new one) with the
    store's compare-and-swap loop; the status written."""
    written: dict = {}

    def apply(raw: bytes | None) -> bytes:
        written.clear()
        written.update(change(_parse(raw) if raw else {}))
        return json.dumps(written, sort_keys=True).encode()

    opening.open_store(config).update(status_key(node), apply)
    return written


def _parse(raw: bytes) -> dict:
    """The status document; {} for one that is damaged (read_json's rule)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
