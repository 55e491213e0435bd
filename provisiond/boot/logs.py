"""The boot log: one line per boot step, buffered and flushed once a second.

A write per line to a slow log file cost the DHCP loop half its rate and an HTTP worker a
good part of its requests; a 64 KiB buffer emptied by one thread per process costs neither.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading

FORMAT = "%(asctime)s %(name)s %(message)s"


class BufferedLogHandler(logging.StreamHandler):
    """Formats into a buffered stream; `flush_now` (the flusher thread, exit) writes it out."""

    def __init__(self):
        super().__init__(open(sys.stderr.fileno(), "w", buffering=1 << 16, closefd=False))

    def flush(self) -> None:
        pass

    def flush_now(self) -> None:
        with self.lock:
            self.stream.flush()


def setup_logging(level: str, interval: float = 1.0) -> BufferedLogHandler:
    """Route every log line through one buffered handler flushed every `interval` s."""
    handler = BufferedLogHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    atexit.register(handler.flush_now)
    stop = threading.Event()
    threading.Thread(target=_flusher, args=(handler, stop, interval), name="log-flush",
                     daemon=True).start()
    return handler


def _flusher(handler: BufferedLogHandler, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        handler.flush_now()


def flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        getattr(handler, "flush_now", handler.flush)()
