"""The audit log for the CLI and the API: who changed what and which fields, oldest first,
paged by sequence number."""

from __future__ import annotations

from provisiond import audit
from provisiond.config import Config
from provisiond.errors import InvalidInput
from provisiond.service.inventory import check_limit, decode_cursor, encode_cursor


def read_audit(config: Config, *, after: int = 0, limit: int = 100, actor: str | None = None,
               target: str | None = None, action: str | None = None,
               cursor: str | None = None) -> tuple[list[dict], str | None]:
    """Entries after seq `after` (or the `cursor` of a previous page), and the next page's
    cursor when the page is full."""
    if cursor is not None:
        after = decode_cursor(cursor, int)
    if after < 0:
        raise InvalidInput("after must be 0 or more", field="after")
    entries = audit.read(config, after=after, limit=check_limit(limit), actor=actor,
                         target=target, action=action)
    more = len(entries) == limit
    return entries, encode_cursor(entries[-1]["seq"]) if more else None
