"""The event stream: what happened, for `GET /api/v1/events` (Server-Sent Events), the status
page and `node status`.

Every process appends to one bounded journal (provisiond/journal.py): `<state>/events/` with
the files store, keys under `events/` on a shared one (etcd), so every server sees every
event:
the CLI and the API after an inventory change, the phase writer for each boot phase, job
runners, the auth check. Emitting never fails the caller: an event that cannot be written is
logged and dropped, since a boot or an inventory change must not fail for the journal.

Kinds: `inventory.changed` (revision, kind, names, fields), `node.phase` (phase, detail),
`build.started|finished|failed`, `job.started|progress|finished`, `auth.denied` (reason, token
name when known), `token.refused`, `secret.changed` (keys, never values).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from provisiond.config import Config
from provisiond.journal import Journal, StoreJournal, journal_on
from provisiond.metrics import timed_build
from provisiond.state import open as opening
from provisiond.state.layout import Layout

log = logging.getLogger("provisiond.events")
MAX_BYTES = 8 << 20  # about 30,000 phase events; then the oldest half goes
KEEP_BYTES = 4 << 20
KEEP_RECORDS = 4000  # on a shared store, where each read lists them (~1 MiB)


class Event(BaseModel):
    id: int
    time: float
    kind: str
    subject: str | None = None
    data: dict = {}


def events_path(config: Config) -> Path:
    return Layout.of(config).events


def journal(config: Config) -> Journal | StoreJournal:
    return journal_on(opening.open_store(config), "events/", events_path(config), MAX_BYTES,
                      KEEP_BYTES, keep_records=KEEP_RECORDS)


def emit(config: Config, kind: str, subject: str | None = None, data: dict | None = None
         ) -> int | None:
    """Append an event; its id, or None when it could not be written (logged)."""
    record = {"time": round(time.time(), 6), "kind": kind, "subject": subject,
              "data": data or {}}
    try:
        return journal(config).append(record)
    except (OSError, ValueError) as exc:
        log.warning("event %s for %s not recorded: %s", kind, subject, exc)
        return None


@contextlib.contextmanager
def build_events(config: Config, subject: str, data: dict) -> Iterator[dict]:
    """`build.started` now, then `build.finished` with what the block put in the dict it
    gets, or `build.failed` with the error's message (the error goes on). The build's
    seconds and outcome also go to the metrics (by `data["what"]`: image, overlays)."""
    emit(config, "build.started", subject, data)
    outcome: dict = {}
    try:
        with timed_build(config, str(data.get("what", "build"))):
            yield outcome
    except BaseException as exc:
        message = str(exc) or type(exc).__name__
        emit(config, "build.failed", subject, {**data, "message": message})
        raise
    emit(config, "build.finished", subject, {**data, **outcome})


def read_since(config: Config, after_id: int, limit: int = 1000,
               kinds: frozenset[str] | None = None) -> list[Event]:
    """Events with id > after_id, oldest first; only `kinds` (exact, or a prefix ending in
    '.', e.g. 'job.') when given."""
    keep = None if not kinds else (lambda record: _kind_matches(record.get("kind"), kinds))
    found = []
    for record in journal(config).read_since(after_id, limit, keep):
        try:
            found.append(Event.model_validate(record))
        except ValueError:
            continue  # a hand-edited line
    return found


def wait(config: Config, after_id: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for an event after `after_id` (the store's watch on a
    shared store); True when there may be one."""
    return journal(config).wait(after_id, timeout)


def latest_id(config: Config) -> int:
    return journal(config).latest_id()


def oldest_id(config: Config) -> int:
    return journal(config).oldest_id()


def _kind_matches(kind, kinds: frozenset[str]) -> bool:
    if not isinstance(kind, str):
        return False
    return kind in kinds or any(k.endswith(".") and kind.startswith(k) for k in kinds)
