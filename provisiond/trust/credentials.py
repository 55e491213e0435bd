"""Node credentials: what a node's agent gets, once per boot, for its provisioning token,
and then shows (`Authorization: Bearer <credential>`) for its runtime overlay, the refreshes
and every status report.

`secrets/nodes/<node>.json` on the store (0600 files in a 0700 directory with the files store,
encrypted in etcd) keeps per node the sha256 of
its one current credential (never the credential), `not_before_ms` (tokens issued earlier
are refused: a later exchange or a revocation superseded them) and the nonces of the tokens
already exchanged, until they expire. It is written by compare-and-swap, only by an
exchange or a revocation: reading it is all a request with a credential costs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from enum import Enum

from pydantic import BaseModel, ValidationError

from provisiond.config import Config
from provisiond.errors import Forbidden, Unauthenticated
from provisiond.state import open as opening
from provisiond.state.layout import KEYS, Layout
from provisiond.trust import tokens

CREDENTIAL_BYTES = 32  # 43 characters
PRIVILEGED_PORTS = 1024


class Refusal(str, Enum):
    """Why a provisioning token was refused (the `reason` of a `token.refused` event)."""

    INVALID = "invalid"
    EXPIRED = "expired"
    WRONG_ADDRESS = "wrong_address"
    UNPRIVILEGED_PORT = "unprivileged_port"
    REUSED = "reused"
    SUPERSEDED = "superseded"


EXPLAINED = {
    Refusal.INVALID: "not a token this server minted for this node, its MAC and addresses",
    Refusal.EXPIRED: "expired (trust.token_minutes)",
    Refusal.WRONG_ADDRESS: "sent from an address not reserved for the node",
    Refusal.UNPRIVILEGED_PORT: "neither sent from a source port below 1024 nor with a "
                               "callback port below 1024 (only root on the node may "
                               "exchange it)",
    Refusal.REUSED: "used already",
    Refusal.SUPERSEDED: "issued before the node's current credential or its revocation",
}


class ProvisioningTokenRefused(Unauthenticated):
    """A provisioning token that cannot be exchanged; `reason` says why."""

    def __init__(self, node: str, reason: Refusal, address: str):
        super().__init__(f"provisioning token for {node} refused: {EXPLAINED[reason]}")
        self.node = node
        self.reason = reason
        self.address = address


Refused = ProvisioningTokenRefused


class IssuedCredential(BaseModel):
    sha256: str
    issued: float
    address: str


class NodeTrust(BaseModel):
    """The per-node document."""

    credential: IssuedCredential | None = None
    not_before_ms: int = 0
    used: dict[str, int] = {}
    """nonce -> when the token expires (ms): a reuse until then is `reused`, later
    `expired`."""


def exchange(config: Config, node, text: str, address: str, port: int | None,
             deliver: Callable[[str], None] | None = None) -> str:
    """A new credential for `node` (an inventory Node) in return for the token `text`
    received from `address`; raises ProvisioningTokenRefused. `port` must prove that root
    on the node sent it (below 1024): the request's source port, or the port `deliver`
    hands the credential to before it counts (a delivery that fails raises and uses nothing
    up).
    The node's previous credential ends."""
    token = _checked_token(config, node, text, address, port)
    _check_unused(_read(config, node.name), token, node.name, address)
    credential = secrets.token_urlsafe(CREDENTIAL_BYTES)
    if deliver is not None:
        deliver(credential)  # counts only once stored below: a lost race leaves it useless
    now = tokens.now_ms()

    def take(trust: NodeTrust) -> None:
        _check_unused(trust, token, node.name, address)
        trust.used = {n: t for n, t in trust.used.items() if t >= now}
        trust.used[token.nonce] = token.issued_ms + _lifetime_ms(config)
        trust.credential = IssuedCredential(sha256=_digest(credential), issued=now / 1000,
                                            address=address)
        trust.not_before_ms = now

    _edit(config, node.name, take)
    return credential


def _check_unused(trust: NodeTrust, token: tokens.Token, name: str, address: str) -> None:
    if token.nonce in trust.used:
        raise Refused(name, Refusal.REUSED, address)
    if token.issued_ms < trust.not_before_ms:
        raise Refused(name, Refusal.SUPERSEDED, address)


def _checked_token(config: Config, node, text: str, address: str, port: int | None
                   ) -> tokens.Token:
    """The token once everything but its single use is checked."""
    token = tokens.parse(text)
    if token is None or token.mac not in node.macs or not tokens.verify(
            tokens.load_key(config), token, tokens.binding_for(node, token.mac)):
        raise Refused(node.name, Refusal.INVALID, address)
    if tokens.now_ms() > token.issued_ms + _lifetime_ms(config):
        raise Refused(node.name, Refusal.EXPIRED, address)
    if address not in node.addresses:
        raise Refused(node.name, Refusal.WRONG_ADDRESS, address)
    if config.trust.privileged_port and not (port is not None and port < PRIVILEGED_PORTS):
        raise Refused(node.name, Refusal.UNPRIVILEGED_PORT, address)
    return token


def authenticate(config: Config, node, authorization: str | None, address: str,
                 reads=None) -> None:
    """Pass if `authorization` is `Bearer <the node's current credential>` sent from one
    of its reserved addresses; else Unauthenticated (no or a wrong credential) or
    Forbidden (the right one from elsewhere). `reads`: what the node's document is read
    through first (a server's WatchedCopy: no request on etcd)."""
    credential = bearer(authorization)
    if credential is None:
        raise Unauthenticated(f"{node.name}: this needs the node's credential "
                              "(Authorization: Bearer ...)")
    if not _is_current(config, node.name, credential, reads):
        raise Unauthenticated(f"{node.name}: not the node's current credential (revoked, "
                              "replaced by a later boot, or never issued)")
    if address not in node.addresses:
        raise Forbidden(f"{node.name}: its credential is accepted only from its own "
                        "addresses")


def _is_current(config: Config, name: str, credential: str, reads=None) -> bool:
    """Whether `credential` is the node's current one as `reads` has it, or else as the
    store has it: a copy refuses nothing alone, since it may not hold yet the credential
    the node got a moment ago (from another worker, another server)."""
    for source in ([reads] if reads is not None else []) + [None]:
        issued = _read(config, name, source).credential
        if issued is not None and hmac.compare_digest(issued.sha256, _digest(credential)):
            return True
    return False


def bearer(authorization: str | None) -> str | None:
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value and len(value) <= 200 else None


def revoke(config: Config, names: list[str]) -> list[str]:
    """End the nodes' credentials and every token minted until now; the names that had a
    credential."""
    ended = []

    def end(trust: NodeTrust) -> None:
        if trust.credential is not None and name not in ended:
            ended.append(name)
        trust.credential = None
        trust.not_before_ms = tokens.now_ms()

    for name in names:
        _edit(config, name, end)
    return ended


def has_credential(config: Config, name: str) -> bool:
    return _read(config, name).credential is not None


def forget(config: Config, names: list[str]) -> None:
    """Delete what the (deleted) nodes left: a new node of that name inherits nothing."""
    store = opening.open_store(config)
    for name in names:
        store.delete(trust_key(name))


def trust_key(name: str) -> str:
    return str(KEYS.trust(name))


def _read(config: Config, name: str, reads=None) -> NodeTrust:
    """The node's document (through `reads`, else from the store); a missing or damaged
    one reads as empty (no credential: the node reboots, it is not let in)."""
    entry = (reads or opening.open_store(config)).get(trust_key(name))
    return _parse(entry.value if entry else None)


def _parse(raw: bytes | None) -> NodeTrust:
    try:
        return NodeTrust.model_validate(json.loads(raw)) if raw is not None else NodeTrust()
    except (ValueError, ValidationError):
        return NodeTrust()


def _edit(config: Config, name: str, change: Callable[[NodeTrust], None]) -> None:
    """Apply `change` to the node's document (again if another server wrote it meanwhile);
    an error from it writes nothing."""
    def apply(raw: bytes | None) -> bytes:
        trust = _parse(raw)
        change(trust)
        return trust.model_dump_json().encode()

    store = opening.open_store(config)
    if store.url.startswith("files://"):  # as before the store: the node names hidden too
        layout = Layout.of(config)
        layout.trust_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store.update(trust_key(name), apply)


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def _lifetime_ms(config: Config) -> int:
    return int(config.trust.token_minutes * 60_000)
