"""Where every change is told: the audit log (who changed which fields) and the event
journal (what clients watching `GET /api/v1/events` see). One place for both, so no write
path forgets one of them."""

from __future__ import annotations

import logging

from provisiond.config import Config
from provisiond.errors import ProvisiondError

log = logging.getLogger("provisiond.service")


def emit(config: Config, kind: str, subject: str | None = None,
         data: dict | None = None) -> int | None:
    """provisiond.events.emit: never raises; None when the journal cannot be written."""
    try:
        from provisiond import events
    except ImportError:  # the journal module lands separately
        return None
    return events.emit(config, kind, subject, data)


def audit(config: Config, actor: str, action: str, target: str,
          changes: dict | None = None) -> None:
    """provisiond.audit.record: one line per change, field names only."""
    try:
        from provisiond import audit as audit_log
    except ImportError:  # the audit module lands separately
        return
    try:
        audit_log.record(config, actor, action, target, changes)
    except (OSError, ValueError) as exc:  # the change is made: say it was not recorded
        raise ProvisiondError(f"{action} {target} was done but not recorded in the audit "
                              f"log: {exc}") from None
