"""The server's log: one line per event, with its level, as text or JSON (`log.format`),
buffered and flushed once a second; secrets are masked before a line is written.

A write per line to a slow log file cost the DHCP loop half its rate and an HTTP worker a
good part of its requests; a 64 KiB buffer emptied by one thread per process costs neither.

One line per event, always: a newline or another control character in a message (a TFTP
file name, a path a client sent) or a traceback is written escaped (`\\n`), so no client
can start a forged line and a log shipper never splits an event. Under systemd the lines go
to journald through stderr.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import re
import sys
import threading

from provisiond.config import CONTROL_RE

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LEVEL_ENV = "PROVISIOND_LOG_LEVEL"
FORMAT_ENV = "PROVISIOND_LOG_FORMAT"
MASK = "<redacted>"
# Credentials as they appear in text: an Authorization header or a bearer token, a URL's
# user:password@, and key=value / "key": "value" pairs whose key names a secret (BMC
# passwords, API and provisioning tokens, session keys).
SECRET_PATTERNS = [
    re.compile(r"(?i)(\bauthorization\s*[:=]\s*)(\S+\s+)?\S+"),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(?i)(://[^/\s:@]+:)[^@\s/]+(?=@)"),
    re.compile(r"(?i)((?:password|passwd|secret|token|credential|api_?key|session_?key)"
               r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]+"),
]


def redact(text: str) -> str:
    """`text` with every credential the patterns know masked."""
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def one_line(text: str) -> str:
    """Control and format characters escaped (`\\n`, `\\x1b`): one line whatever the input."""
    return CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], text)


class TextFormatter(logging.Formatter):
    """`2024-05-01 12:00:00,123 INFO provisiond.boot message`, one line, secrets masked."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return one_line(redact(super().format(record)))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, pid, and the
    traceback as `exception` when there is one; secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
                 .isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name,
                 "message": redact(record.getMessage()), "pid": record.process}
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry)  # ASCII: no byte of it can end the line


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}


class BufferedLogHandler(logging.StreamHandler):
    """Formats into a buffered stream; `flush_now` (the flusher thread, exit) writes it out."""

    def __init__(self):
        super().__init__(open(sys.stderr.fileno(), "w", buffering=1 << 16, closefd=False))

    def flush(self) -> None:
        pass

    def flush_now(self) -> None:
        with self.lock:
            self.stream.flush()


def setup_logging(level: str, fmt: str = "text", interval: float = 1.0) -> BufferedLogHandler:
    """Route every log line (gunicorn's too) through one buffered handler flushed every
    `interval` s, formatted as `fmt` (text or json)."""
    flush_logs()  # lines buffered before (gunicorn's arbiter, in a worker) first, in order
    handler = BufferedLogHandler()
    handler.setFormatter(FORMATTERS[fmt]())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in ("gunicorn.error", "gunicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    atexit.register(handler.flush_now)
    stop = threading.Event()
    threading.Thread(target=_flusher, args=(handler, stop, interval), name="log-flush",
                     daemon=True).start()
    return handler


def setup_logging_from_env() -> BufferedLogHandler:
    """For serve's children (gunicorn): the level and format serve chose, from the env."""
    level = os.environ.get(LEVEL_ENV, "INFO")
    fmt = os.environ.get(FORMAT_ENV, "text")
    return setup_logging(level if level in LEVELS else "INFO", fmt if fmt in FORMATS else "text")


def _flusher(handler: BufferedLogHandler, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        handler.flush_now()


def flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        getattr(handler, "flush_now", handler.flush)()
