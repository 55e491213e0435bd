"""Provisioning tokens: minted with each node's iPXE script, carried on its kernel command
line (`provisiond.token=`), exchanged once by the node's agent for a node credential.

A token is signed, not stored: `1.<issued, ms hex>.<MAC, 12 hex>.<nonce>.<signature>`, the
signature an HMAC-SHA256 (key `secrets/token.key` on the store, a 0600 file with the files
store, encrypted in etcd; made on first use, shared by every server) over the
node's name, the MAC its script was asked for, the node's reserved addresses, the issue time
and the nonce. Minting is an HMAC (no write on the boot path); a token stops verifying when
the node's name, MACs or addresses change. Using it once is the exchange's part
(provisiond.trust.credentials keeps the nonces it took).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import ProvisiondError, StaleRevision
from provisiond.state import open as opening
from provisiond.state.store import ABSENT
from provisiond.state.layout import KEYS, Layout

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


KEY = str(KEYS.token_key)


def key_path(config: Config) -> Path:
    """Where the files store keeps the key (what messages name)."""
    return Layout.of(config).token_key


def load_key(config: Config, reads=None) -> bytes:
    """The signing key, made on first use. Every process and server reads the same one: a
    second maker loses the race (its put expects no key) and reads the winner's. `reads`:
    what to read it through (a server's WatchedCopy), the store by default."""
    key = _usable((reads or opening.open_store(config)).get(KEY))
    return key if key is not None else _load(config)


def _usable(entry) -> bytes | None:
    return entry.value if entry is not None and len(entry.value) == KEY_BYTES else None


def _load(config: Config) -> bytes:
    """The key on the store, made if there is none."""
    store = opening.open_store(config)
    entry = store.get(KEY)
    if entry is None:
        key = secrets.token_bytes(KEY_BYTES)
        try:
            store.put(KEY, key, expect=ABSENT)
            return key
        except StaleRevision:
            entry = store.get(KEY)
    if entry is None or len(entry.value) != KEY_BYTES:
        size = len(entry.value) if entry else 0
        raise ProvisiondError(f"{key_path(config)} is not a token key ({size} bytes, not "
                              f"{KEY_BYTES}); delete it to make a new one")
    return entry.value


class SigningKey:
    """The key as a long-lived process (a server minting tokens) holds it: read with each
    use, so that a key replaced or deleted (then made anew) signs no token an exchange
    refuses. Through `reads`, a server's WatchedCopy on etcd: no request per use."""

    def __init__(self, config: Config, reads=None):
        self.config = config
        self.reads = reads
        self._making = threading.Lock()
        self._made: tuple[int, bytes | None, Exception | None] = (0, None, None)
        """how many loads so far, the last one's key or error"""

    def get(self) -> bytes:
        key = _usable((self.reads or opening.open_store(self.config)).get(KEY))
        if key is not None:
            return key
        asked = self._made[0]
        with self._making:  # a storm's first scripts find none at once: one makes it
            loads, key, error = self._made
            if loads != asked:  # loaded while this one waited: its key, or its failure
                if error is not None:  # (the store away: not each script in turn)
                    raise error
                return key
            try:
                key = _load(self.config)
            except Exception as exc:
                self._made = (loads + 1, None, exc)
                raise
            self._made = (loads + 1, key, None)
            return key
