"""`GET /api/v1/events` (reader): the event journal (provisiond.events) as Server-Sent Events.

Each event goes out as `id: N` and `data: {"id", "time", "kind", "subject", "data"}` (no
`event:` field, so an EventSource's `onmessage` sees every kind). A client resumes with
`Last-Event-ID` (EventSource sends it when it reconnects) or `?after=N`; without either the
stream starts with the next event. When events the client asked for are gone from the bounded
journal, the first message says so: kind `stream.gap`, no id, with `after`, `oldest_id` and
`missed`. `?kinds=job.,node.phase` keeps those kinds (exact, or a prefix ending in '.').

A stream is a greenlet of the gevent worker: it reads the next events, then waits for newer
ones (events.wait: the store's watch on a shared store, the journal file's stat every 0.15 s
with the files store); a comment line every KEEPALIVE_SECONDS keeps proxies from
closing an idle stream and finds a client that has gone. `http.event_streams` bounds the
streams of one worker (503 above it). A stopping worker ends its streams at its graceful
timeout (5 s); the clients reconnect with their Last-Event-ID.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

from flask import Response, request
from pydantic import BaseModel, ConfigDict, Field

from provisiond import events
from provisiond.api.v1 import Role, config, route
from provisiond.config import Config
from provisiond.errors import InvalidInput, Unavailable

WAIT_SECONDS = 1.0  # the longest one wait for events lasts (then the keepalive is due?)
KEEPALIVE_SECONDS = 15.0
BATCH = 500  # events read (and sent in one write) at a time
RETRY_MS = 2000  # how long an EventSource waits before it reconnects


class StreamSlots:
    """How many streams this process serves at once, bounded."""

    def __init__(self):
        self.used = 0
        self._lock = threading.Lock()

    def take(self, limit: int) -> None:
        with self._lock:
            if self.used >= limit:
                raise Unavailable(f"this worker already serves {limit} event streams "
                                  "(http.event_streams); retry later")
            self.used += 1

    def give(self) -> None:
        with self._lock:
            self.used -= 1


SLOTS = StreamSlots()


def start_after(config: Config, last_event_id: str | None, after: int | None) -> int:
    """Where a stream starts: the Last-Event-ID header, else ?after=, else now."""
    if last_event_id is not None and last_event_id.strip():
        try:
            value = int(last_event_id)
        except ValueError:
            raise InvalidInput("Last-Event-ID: not an event id") from None
        if value < 0:
            raise InvalidInput("Last-Event-ID: not an event id")
        return value
    return events.latest_id(config) if after is None else after


def parse_kinds(text: str | None) -> frozenset[str] | None:
    kinds = frozenset(k.strip() for k in (text or "").split(",") if k.strip())
    return kinds or None


class EventStream:
    """The SSE text of the journal's events after `after`, until the client goes (found by
    the next write) or the worker stops; `clock` and `wait` (events.wait) are replaced in
    tests."""

    def __init__(self, config: Config, after: int, kinds: frozenset[str] | None,
                 on_close: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[Config, int, float], bool] = events.wait):
        self.config, self.last, self.kinds = config, after, kinds
        self.on_close, self.clock, self.wait = on_close, clock, wait

    def close(self) -> None:
        """Called by the server when the response ends, even one never iterated (a
        generator's `finally` would not run then)."""
        on_close, self.on_close = self.on_close, lambda: None
        on_close()

    def __iter__(self) -> Iterator[str]:
        yield f"retry: {RETRY_MS}\n\n"
        quiet_since, ready = self.clock(), True
        while True:
            if ready:
                text, more = self._read()
                if text:
                    yield text
                    quiet_since = self.clock()
                if more:  # a full batch: read on at once
                    continue
            if self.clock() - quiet_since >= KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                quiet_since = self.clock()
            ready = self.wait(self.config, self.last, WAIT_SECONDS)

    def _read(self) -> tuple[str, bool]:
        """The SSE text of the next batch, and whether more may be waiting."""
        newest = events.latest_id(self.config)
        text = self._gap(newest)
        found = events.read_since(self.config, self.last, BATCH, self.kinds)
        for event in found:
            text += f"id: {event.id}\ndata: {event.model_dump_json()}\n\n"
        more = len(found) == BATCH
        # Every id up to `newest` was read (a short batch reads to the end): skip past the
        # events the kinds filter dropped, or they are read again at each change.
        self.last = max([self.last, *(e.id for e in found[-1:])] + ([] if more else [newest]))
        return text, more

    def _gap(self, newest: int) -> str:
        """A `stream.gap` message when the journal lost events after `last` (trimmed away),
        or holds only older ids than `last` (a new journal); `last` moves past the loss."""
        oldest = events.oldest_id(self.config)
        if oldest and oldest > self.last + 1:
            missed = oldest - self.last - 1
        elif self.last > newest:
            missed = None  # the journal was started again: everything it holds is new
            oldest = max(oldest, 1)
        else:
            return ""
        data = {"after": self.last, "oldest_id": oldest, "missed": missed}
        self.last = oldest - 1
        message = {"id": None, "time": round(time.time(), 6), "kind": "stream.gap",
                   "subject": None, "data": data}
        return f"data: {json.dumps(message)}\n\n"


class EventsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after: int | None = Field(None, ge=0, description="start after this event id (the "
                              "Last-Event-ID header wins); default: the next event")
    kinds: str | None = Field(None, max_length=500, description="comma-separated kinds, or "
                              "prefixes ending in '.' (job.,node.phase); default: all")


@route("/events", "GET", role=Role.READER, query=EventsQuery, produces="text/event-stream",
       errors=(503,),
       summary="Server-Sent Events from the event journal, resumable with Last-Event-ID")
def stream_events(principal, body, query: EventsQuery):
    """`id:` and `data:` (the event as JSON) per event; a `stream.gap` message first when
    events asked for are gone; a comment every 15 s when there is nothing to send."""
    settings = config()
    after = start_after(settings, request.headers.get("Last-Event-ID"), query.after)
    SLOTS.take(settings.http.event_streams)
    stream = EventStream(settings, after, parse_kinds(query.kinds), on_close=SLOTS.give)
    return Response(stream, mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
