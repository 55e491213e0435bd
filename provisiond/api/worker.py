"""The gunicorn worker `provisiond serve` runs: gevent, one greenlet per connection.

With gunicorn's thread worker, a client that sends half a request holds a thread until it
finishes: 80 of them held all 32 threads and every boot request waited. Here an idle or slow
connection costs a greenlet; the header read of each request is bounded by gunicorn's
keepalive timeout (the worker's `timeout_ctx`), every other socket wait by http.client_timeout,
and the number of connections by `worker_connections`.

gevent's socket copies a file through Python 8 KiB at a time (os.sendfile is not
cooperative), which serves blobs at a fraction of nginx's rate: sockets here send files with
os.sendfile on the non-blocking descriptor and wait for writability in the event loop.
"""

from __future__ import annotations

import errno
import json
import os

import gevent
from gevent import socket as gsocket
from gunicorn.workers.base_async import AsyncWorker
from gunicorn.workers.ggevent import GeventWorker

from provisiond.api import error_document, status_slug
from provisiond.boot.supervisor import CLIENT_TIMEOUT_ENV
from provisiond.config import HttpSettings

MAX_CHUNK = 1 << 30


def _reset_on_timeout(method):
    """`method` of gevent's socket, a timed-out wait raised as a reset."""

    def bounded(self, *args):
        try:
            return method(self, *args)
        except TimeoutError:
            raise _timed_out(self.gettimeout()) from None

    return bounded


class SendfileSocket(gsocket.socket):
    """A gevent socket whose `sendfile` is the kernel's, waiting cooperatively; a wait
    that times out ends the connection as a reset (gunicorn logs those at debug level,
    other socket errors with a traceback: a slow client is no server error)."""

    __slots__ = ()

    recv = _reset_on_timeout(gsocket.socket.recv)
    recv_into = _reset_on_timeout(gsocket.socket.recv_into)
    sendall = _reset_on_timeout(gsocket.socket.sendall)

    def sendfile(self, file, offset: int = 0, count: int | None = None) -> int:
        out, src = self.fileno(), file.fileno()
        sent = 0
        while count is None or sent < count:
            chunk = MAX_CHUNK if count is None else min(count - sent, MAX_CHUNK)
            try:
                done = os.sendfile(out, src, offset + sent, chunk)
            except BlockingIOError:
                gsocket.wait_write(out, timeout=self.gettimeout(), timeout_exc=_timed_out(self.gettimeout()))
                continue
            if done == 0:  # end of file
                break
            sent += done
        file.seek(offset + sent)
        return sent


def client_timeout() -> float:
    """Seconds one send or receive may wait before the connection ends: http.client_timeout
    as serve passed it, else its default (gunicorn run by hand)."""
    default = HttpSettings.model_fields["client_timeout"].default
    try:
        seconds = float(os.environ.get(CLIENT_TIMEOUT_ENV, default))
    except ValueError:
        return default
    return seconds if seconds > 0 else default


def _timed_out(seconds: float | None) -> ConnectionResetError:
    return ConnectionResetError(errno.ECONNRESET, f"client idle for {seconds or 0:g} s")


class _ErrorPage:
    """Stands in for the client while gunicorn's `handle_error` logs a request it could
    not parse (or a crash) and writes its HTML error page: keeps the page."""

    def __init__(self):
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data


def json_error(page: bytes, exc: BaseException) -> bytes:
    """gunicorn's error page in the app's one error shape (api.error_document)."""
    status, _, reason = page.split(b"\r\n", 1)[0].decode("latin-1")[9:].partition(" ")
    if status.startswith("5"):
        message, code = "internal error", "internal"  # as the app says it
    else:
        message, code = f"{reason}: {exc}"[:300], status_slug(int(status), reason)
    body = json.dumps(error_document(code, message)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode("latin-1") + body


class BootWorker(GeventWorker):
    """gunicorn's gevent worker with bounded socket waits, kernel sendfile, and JSON error
    answers to requests it cannot parse (as every error of the app)."""

    def handle_error(self, req, client, addr, exc):
        page = _ErrorPage()
        super().handle_error(req, page, addr, exc)  # its status, its log lines
        if not page.data:
            return
        try:
            client.sendall(json_error(page.data, exc))
        except OSError:
            self.log.debug("Failed to send error message.")

    def init_process(self):
        # A greenlet's crash goes to the log as one line, not as a traceback on stderr.
        gevent.get_hub().print_exception = self._greenlet_failed
        self.client_timeout = client_timeout()
        if self.cfg.is_ssl:  # gevent's server does the TLS handshake before handle():
            gsocket.setdefaulttimeout(self.client_timeout)  # a silent client must not hold it
        super().init_process()

    def _greenlet_failed(self, context, kind, value, tb) -> None:
        """A client's fault (a failed or timed-out TLS handshake, plain HTTP on the TLS
        port) is a debug line, as gunicorn logs its SSL errors; so is a worker quitting
        (Ctrl-C: gunicorn's quit handler calls sys.exit(0) in a greenlet, which gevent's
        shutdown of the worker hands here, although the hub counts it no error); anything
        else is a bug."""
        if kind is not None and issubclass(kind, gevent.get_hub().NOT_ERROR):
            self.log.debug("greenlet %s ended: %s: %s", context, kind.__name__, value)
            return
        if kind is not None and issubclass(kind, OSError):
            self.log.debug("connection ended before its request: %s: %s", kind.__name__, value)
            return
        self.log.error("greenlet %s failed: %s", context, value, exc_info=(kind, value, tb))

    def handle(self, listener, client, addr):
        if type(client) is gsocket.socket:  # with TLS (the API's listener), an SSLSocket
            client.__class__ = SendfileSocket  # no new slots: the same object, other methods
        client.settimeout(self.client_timeout)
        # Not GeventWorker.handle: it makes the socket blocking, without a timeout.
        AsyncWorker.handle(self, listener, client, addr)
