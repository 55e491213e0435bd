"""The audit record: every change to the inventory, secrets, tokens and every operation, with
who made it, when, and which fields changed (never a secret's value).

One bounded journal (provisiond/journal.py: `<state>/audit/` with the files store, keys under
`audit/` on a shared one, etcd), written by the CLI
(actor `cli:USER`) and the API (actor `token:NAME`); `provisiond audit` and
`GET /api/v1/audit` read it. Its `seq` is the journal id. Unlike events, a change that cannot
be audited fails: the caller records before it reports success.
"""

from __future__ import annotations

import getpass
import os
import time
from pathlib import Path

from provisiond.config import Config
from provisiond.journal import Journal, StoreJournal, journal_on
from provisiond.state import open as opening
from provisiond.state.layout import Layout

MAX_BYTES = 64 << 20  # then the oldest half goes: about 150,000 changes stay
KEEP_BYTES = 32 << 20
KEEP_RECORDS = 20_000  # on a shared store, where each read lists them (~5 MiB)


def audit_path(config: Config) -> Path:
    return Layout.of(config).audit


def journal(config: Config) -> Journal | StoreJournal:
    return journal_on(opening.open_store(config), "audit/", audit_path(config), MAX_BYTES,
                      KEEP_BYTES, mode=0o600, keep_records=KEEP_RECORDS)


_caller: list[str] = []  # cli_actor() fixed before the CLI became the state dir's owner


def cli_actor() -> str:
    """`cli:USER` for the user running the CLI (sudo's caller when there is one)."""
    return _caller[0] if _caller else _login_actor()


def keep_cli_actor() -> None:
    """Fix cli_actor() to who runs the CLI now, before it gives up root for the state
    directory's owner: afterwards getpass would name that owner (where no LOGNAME or USER
    says root), and root's changes would be audited as the service's."""
    _caller[:] = [_login_actor()]


def _login_actor() -> str:
    user = os.environ.get("SUDO_USER")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
    return f"cli:{user}"


def record(config: Config, actor: str, action: str, target: str,
           changes: dict | list | None = None) -> int:
    """Note a change; returns its seq. `changes`: changed field names (a list), or a mapping
    of names to a short description (never a secret value). Raises OSError or ValueError."""
    entry = {"time": round(time.time(), 6), "actor": actor, "action": action,
             "target": target, "changes": changes if changes is not None else []}
    return journal(config).append(entry)


def read(config: Config, *, after: int = 0, limit: int = 100, actor: str | None = None,
         target: str | None = None, action: str | None = None) -> list[dict]:
    """Entries with seq > after, oldest first, filtered by exact actor/target/action."""
    def keep(entry: dict) -> bool:
        return ((actor is None or entry.get("actor") == actor)
                and (target is None or entry.get("target") == target)
                and (action is None or entry.get("action") == action))

    entries = journal(config).read_since(after, limit, keep)
    return [{"seq": entry.pop("id"), **entry} for entry in entries]
