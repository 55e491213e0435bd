"""`POST /api/v1/credentials/<node>`: a node's agent trades its provisioning token (from the
kernel command line) for its node credential, once per boot.

Only root on the node may: the request comes from a source port below 1024 (curl
--local-port), or it names a `callback` port below 1024 on which the agent listens (busybox
`nc -l`, which cannot pick its outgoing port) and a `callback_key` the listener must say
first, so that no other root service on the node is handed the credential.
"""

from __future__ import annotations

import hmac
import socket
import time

from flask import Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from provisiond.api.services import client_address, client_port, services
from provisiond.api.v1 import route
from provisiond.config import url_host
from provisiond.errors import InvalidInput
from provisiond.trust import ProvisioningTokenRefused, exchange

CALLBACK_SECONDS = 5.0  # for the listener to be there and to say its key


class Exchange(BaseModel):
    """What the node agent sends (a form or JSON)."""

    model_config = ConfigDict(extra="forbid")

    token: str = Field(description="the provisioning token of the kernel command line "
                       "(provisiond.token=)")
    callback: int | None = Field(None, ge=1, le=65535, description="a port below 1024 the "
                                 "agent listens on, to be sent the credential")
    callback_key: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{16,128}$",
                                     description="what the listener says first")

    @model_validator(mode="after")
    def _key_with_callback(self) -> "Exchange":
        if (self.callback is None) != (self.callback_key is None):
            raise ValueError("callback and callback_key go together")
        return self


@route("/credentials/<node>", "POST", role=None, summary="A node trades its provisioning "
       "token for its node credential (open to nodes; root only)", body=Exchange, forms=True,
       produces="text/plain", nodes=True, errors=(401, 403))
def exchange_token(principal, body: Exchange, query, node: str):
    """Answers the credential as one line of text (a shell reads it without a JSON parser),
    or `delivered` once sent to the callback; a refused token is a 401 and a
    `token.refused` event."""
    svc = services()
    record = svc.node(node)
    callback = (body.callback, body.callback_key) if body.callback is not None else None
    port = callback[0] if callback else client_port()
    deliver = (lambda credential: send_by_callback(client_address(), *callback, credential)
               ) if callback else None
    try:
        credential = exchange(svc.config, record, body.token, client_address(), port, deliver)
    except ProvisioningTokenRefused as refused:
        svc.refusals.note(refused)
        raise
    response = Response("delivered\n" if callback else credential + "\n",
                        content_type="text/plain; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


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
    """The first line the listener says, read until the deadline (TimeoutError after it:
    a listener saying a byte at a time holds the request no longer)."""
    data = b""
    while b"\n" not in data and len(data) <= 130:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        chunk = sock.recv(130)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].strip()
