"""Where every change is told: the audit log (who changed which fields) and the event
journal (what clients watching `GET /api/v1/events` see). One place for both, so no write
path forgets one of them."""

from __future__ import annotations

from provisiond import audit as audit_log
from provisiond.config import Config
from provisiond.errors import ProvisiondError
from provisiond.events import emit  # never raises: a change does not fail for an event

__all__ = ["audit", "emit"]


def audit(config: Config, actor: str, action: str, target: str,
          changes: dict | list | None = None) -> int:
    """provisiond.audit.record; a change that cannot be recorded is an error (after it was
    made: the message says so)."""
    try:
        return audit_log.record(config, actor, action, target, changes)
    except (OSError, ValueError) as exc:
        raise ProvisiondError(f"{action} {target} was done but not recorded in the audit "
                              f"log: {exc}") from None
