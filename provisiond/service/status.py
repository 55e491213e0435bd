"""Node boot status for the CLI and the API: each node's phase, the time it reached each
phase of its current boot, and the agent's last detail. Written by the boot servers and the
node agent (provisiond.status), only read here."""

from __future__ import annotations

from provisiond.config import Config
from provisiond.service.inventory import (NODES, check_limit, decode_cursor, expand_names,
                                          page_of_names, snapshot)
from provisiond.status import read_status


def status_of(config: Config, name: str) -> dict:
    """A node's status; a node that has not reported is in phase None."""
    return status_document(name, read_status(config, name) or {})


def status_document(name: str, found: dict) -> dict:
    """A status file's content (provisiond.status) as the API and --json show it."""
    return {"node": name, "phase": found.get("phase"), "phases": found.get("phases", {}),
            "boot_started": found.get("boot_started"), "updated": found.get("updated"),
            "detail": found.get("detail") or None,
            "token_refused": found.get("token_refused"), "memory": found.get("memory")}


def node_status(config: Config, name: str) -> dict:
    if name not in snapshot(config).inventory.nodes:
        raise NODES.not_found(f"no such node: {name}")
    return status_of(config, name)


def list_status(config: Config, names: str | None = None, phase: str | None = None, *,
                limit: int | None = None, after: str | None = None
                ) -> tuple[list[dict], str | None]:
    """A page of nodes' status in name order (`names`: only the nodes of this range;
    `phase`: only nodes in it), and the next page's cursor; every one without `limit`
    (the CLI's: one plain name that is no node is NodeNotFound there)."""
    view = snapshot(config)
    all_names, keys = view.sorted_names(NODES)
    wanted = None
    if names:
        wanted = set(NODES.present(view.inventory, names)) if limit is None else set(
            expand_names(names))
    statuses: dict[str, dict] = {}

    def keep(name: str) -> bool:
        if wanted is not None and name not in wanted:
            return False
        statuses[name] = status_of(config, name)
        return phase is None or statuses[name]["phase"] == phase

    found, cursor = page_of_names(all_names, keys, decode_cursor(after),
                                  check_limit(limit) if limit else len(all_names) or 1, keep)
    return [statuses[name] for name in found], cursor
