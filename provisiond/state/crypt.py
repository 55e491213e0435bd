"""Secret values encrypted for a shared store: AES-256-GCM under a key file each server keeps
(`<state>/store.key`, 0600) and the store never holds.

A sealed value is MAGIC, the key's id (the first 8 bytes of its SHA-256), a 12-byte random
nonce, then the ciphertext and its tag. The store key's name is the associated data, so a
sealed value copied under another key does not open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from provisiond.atomic import fsync_dir
from provisiond.errors import ProvisiondError

MAGIC = b"pvd-aesgcm1:"
KEY_BYTES = 32
NONCE_BYTES = 12
ID_BYTES = 8


class StoreKeyError(ProvisiondError):
    """The key that opens the store's secret values is missing, unreadable or another one."""

    code = "store_key"


class SecretBox:
    """Seal and open secret values with one key."""

    def __init__(self, key: bytes, path: Path):
        self.path = path
        self.aead = AESGCM(key)
        self.key_id = key_id(key)

    def seal(self, name: str, value: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + self.key_id + nonce + self.aead.encrypt(nonce, value, name.encode())

    def open(self, name: str, sealed: bytes) -> bytes:
        if not sealed.startswith(MAGIC):
            raise StoreKeyError(f"{name}: the store holds it unencrypted; a secret is "
                                "always sealed (written by something other than provisiond?)")
        start = len(MAGIC)
        found = sealed[start:start + ID_BYTES]
        if found != self.key_id:
            raise StoreKeyError(f"{name}: sealed with store key {found.hex()}, but "
                                f"{self.path} is key {self.key_id.hex()}: copy store.key "
                                "from a server of this store")
        nonce = sealed[start + ID_BYTES:start + ID_BYTES + NONCE_BYTES]
        try:
            return self.aead.decrypt(nonce, sealed[start + ID_BYTES + NONCE_BYTES:],
                                     name.encode())
        except InvalidTag:
            raise StoreKeyError(f"{name}: does not decrypt with {self.path} (damaged, or "
                                "sealed for another key name)") from None


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:ID_BYTES]


def read_key(path: Path) -> bytes | None:
    """The key in `path` (base64 text); None when there is no such file."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreKeyError(f"{path}: cannot read the store key: "
                            f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        key = base64.b64decode(text, validate=True)
    except binascii.Error:
        key = b""
    if len(key) != KEY_BYTES:
        raise StoreKeyError(f"{path}: not a store key (base64 of {KEY_BYTES} bytes)")
    return key


def create_key(path: Path) -> bytes:
    """A new random key written to `path` (0600, never over an existing file: the key
    another process created meanwhile wins)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.urandom(KEY_BYTES)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(base64.b64encode(key).decode() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)  # whole, and only if there is none yet
    except FileExistsError:
        return read_key(path)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return key
