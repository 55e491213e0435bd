"""`POST /api/v1/credentials/<node>`: a node's agent trades its provisioning token (from the
kernel command line) for its node credential, once per boot.

Only root on the node may: the request comes from a source port below 1024 (curl
--local-port), or it names a `callback` port below 1024 on which the agent listens (busybox
`nc -l`, which cannot pick its outgoing port) and a `callback_key` the listener must say
first, so that no other root service on the node is handed the credential.
"""

from __future__ import annotations

import hmac
import re
import socket
import time

from flask import Blueprint, Response

from provisiond.api.services import client_address, client_port, form_fields, services
from provisiond.config import url_host
from provisiond.errors import InvalidInput
from provisiond.trust import TokenRefused, exchange

bp = Blueprint("credentials", __name__, url_prefix="/api/v1/credentials")
CALLBACK_SECONDS = 5.0  # for the listener to be there and to say its key
KEY_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")


@bp.post("/<node>")
def exchange_token(node: str):
    """Form or JSON body: token=<provisioning token>[, callback=<port>, callback_key=<key>].
    Answers the credential as one line of text (a shell reads it without a JSON parser),
    or `delivered` once sent to the callback; a refused token is a 401 and an event."""
    svc = services()
    record = svc.node(node)
    fields = form_fields()
    callback = _callback(fields)
    port = callback[0] if callback else client_port()
    deliver = (lambda credential: send_by_callback(client_address(), *callback, credential)
               ) if callback else None
    try:
        credential = exchange(svc.config, record, str(fields.get("token") or ""),
                              client_address(), port, deliver)
    except TokenRefused as refused:
        svc.refusals.note(refused)
        raise
    response = Response("delivered\n" if callback else credential + "\n",
                        content_type="text/plain; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


def _callback(fields) -> tuple[int, str] | None:
    """(port, key) of a callback, or None when the request names none."""
    port, key = fields.get("callback"), str(fields.get("callback_key") or "")
    if port is None:
        return None
    if not str(port).isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput("callback must be a port number")
    if not KEY_RE.fullmatch(key):
        raise InvalidInput("callback_key must be 16-128 letters, digits, '-' or '_'")
    return int(port), key


def send_by_callback(address: str, port: int, key: str, credential: str) -> None:
    """Connect to the node's listener, read its key, send the credential; InvalidInput if
    no listener answers with the key in time (then nothing was sent)."""
    deadline = time.monotonic() + CALLBACK_SECONDS
    where = f"{url_host(address)}:{port}"
    try:
        with _connect(address, port, deadline) as sock:
            said = _first_line(sock, deadline)
            if not hmac.compare_digest(said, key.encode()):
                raise InvalidInput(f"the listener on {where} did not say the callback key")
            sock.sendall(credential.encode() + b"\n")
    except OSError as exc:
        raise InvalidInput(f"cannot deliver the credential to {where}: "
                           f"{exc.strerror or exc or type(exc).__name__}") from None


def _connect(address: str, port: int, deadline: float) -> socket.socket:
    """A connection, retried while refused (the listener may still be starting)."""
    while True:
        try:
            return socket.create_connection((address, port),
                                            timeout=max(0.1, deadline - time.monotonic()))
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _first_line(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while b"\n" not in data and len(data) <= 130:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(130)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].strip()
