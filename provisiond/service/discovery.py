"""Discovery records (unknown MACs that asked for DHCP) for the API: oldest first, paged by
their position in the log."""

from __future__ import annotations

from provisiond.boot.discovery import read_discovery
from provisiond.config import Config
from provisiond.inventory.values import normalise_mac
from provisiond.errors import InvalidInput
from provisiond.service.inventory import check_limit, decode_cursor, encode_cursor


def list_discovery(config: Config, mac: str | None = None, *, limit: int = 100,
                   after: str | None = None) -> tuple[list[dict], str | None]:
    """A page of discovery records (only `mac`'s when given) and the next page's cursor."""
    if mac is not None:
        try:
            mac = normalise_mac(mac)
        except ValueError as exc:
            raise InvalidInput(str(exc), field="mac") from None
    start = decode_cursor(after, int) or 0
    if start < 0:
        raise InvalidInput("not a continue token from a previous page", field="continue")
    check_limit(limit)
    records = read_discovery(config)
    found, position = [], start
    for position in range(start, len(records)):
        if mac is None or records[position].get("mac") == mac:
            found.append(records[position])
            if len(found) == limit:
                break
    more = len(found) == limit and position + 1 < len(records)
    return found, encode_cursor(position + 1) if more else None
