"""Provisioning tokens: minted with each node's iPXE script, carried on its kernel command
line (`provisiond.token=`), exchanged once by the node's agent for a node credential.

A token is signed, not stored: `1.<issued, ms hex>.<MAC, 12 hex>.<nonce>.<signature>`, the
signature an HMAC-SHA256 (key `<state>/secrets/token.key`, 0600, made on first use) over the
node's name, the MAC its script was asked for, the node's reserved addresses, the issue time
and the nonce. Minting is an HMAC (no write on the boot path); a token stops verifying when
the node's name, MACs or addresses change. Using it once is the exchange's part
(provisiond.trust.credentials keeps the nonces it took).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import ProvisiondError

VERSION = "1"
KEY_BYTES = 32
NONCE_BYTES = 12  # 16 base64url characters
TOKEN_RE = re.compile(r"1\.([0-9a-f]{1,13})\.([0-9a-f]{12})\.([A-Za-z0-9_-]{16})\."
                      r"([A-Za-z0-9_-]{43})")
MAX_TOKEN_LENGTH = 120  # longer text is not looked at


@dataclass(frozen=True)
class Binding:
    """What a token is bound to: the node, the MAC its script was asked for, and every
    address reserved for the node (IPv4 and IPv6)."""

    node: str
    mac: str
    addresses: tuple[str, ...]

    @property
    def mac_hex(self) -> str:
        return self.mac.replace(":", "")

    def message(self, head: str) -> bytes:
        return "\0".join([VERSION, self.node, self.mac, ",".join(sorted(self.addresses)),
                          head]).encode()


@dataclass(frozen=True)
class Token:
    issued_ms: int
    mac: str
    nonce: str
    head: str
    signature: str


def binding_for(node, mac: str) -> Binding:
    """The binding of `node` (an inventory Node) booting from `mac`."""
    return Binding(node.name, mac, tuple(node.addresses))


def now_ms() -> int:
    return int(time.time() * 1000)


def mint(key: bytes, binding: Binding, issued_ms: int | None = None) -> str:
    """A new token for `binding`."""
    issued = now_ms() if issued_ms is None else issued_ms
    head = f"{issued:x}.{binding.mac_hex}.{secrets.token_urlsafe(NONCE_BYTES)}"
    return f"{VERSION}.{head}.{_sign(key, binding, head)}"


def parse(text: str) -> Token | None:
    """The token's parts, or None for text that is not a token."""
    match = TOKEN_RE.fullmatch(text) if len(text) <= MAX_TOKEN_LENGTH else None
    if match is None:
        return None
    issued, mac_hex, nonce, signature = match.groups()
    mac = ":".join(mac_hex[i:i + 2] for i in range(0, 12, 2))
    return Token(int(issued, 16), mac, nonce, f"{issued}.{mac_hex}.{nonce}", signature)


def verify(key: bytes, token: Token, binding: Binding) -> bool:
    """Whether this server signed `token` for exactly `binding`."""
    return token.mac == binding.mac and hmac.compare_digest(
        token.signature, _sign(key, binding, token.head))


def _sign(key: bytes, binding: Binding, head: str) -> str:
    digest = hmac.new(key, binding.message(head), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def key_path(config: Config) -> Path:
    return config.state_dir / "secrets" / "token.key"


def load_key(config: Config) -> bytes:
    """The signing key, made on first use (0600). Every process reads the same one: a
    second maker loses the race and reads the winner's."""
    path = key_path(config)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = _make_key(path)
    if len(key) != KEY_BYTES:
        raise ProvisiondError(f"{path} is not a token key ({len(key)} bytes, not "
                              f"{KEY_BYTES}); delete it to make a new one")
    return key


class SigningKey:
    """The key as a long-lived process (a server minting tokens) holds it: read again
    when its file was replaced or deleted (then made anew), as every exchange reads it. A
    stat per use; a key kept for good would sign tokens no exchange accepts any more."""

    def __init__(self, config: Config):
        self.config = config
        self._key: bytes | None = None
        self._stamp: tuple | None = None

    def get(self) -> bytes:
        stamp = _stamp(key_path(self.config))
        if self._key is None or stamp is None or stamp != self._stamp:
            self._key = load_key(self.config)
            self._stamp = _stamp(key_path(self.config))
        return self._key


def _stamp(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _make_key(path: Path) -> bytes:
    """Write a new key to a temp file and link it into place only if no key is there
    (link fails on an existing name: the file is never seen half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".token.key.", dir=path.parent)  # 0600
    try:
        key = secrets.token_bytes(KEY_BYTES)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_bytes()
        return key
    finally:
        os.unlink(tmp)
