"""API tokens and roles: who a request is, and what it may do.

A token is a random string shown once when made; `tokens.json` on the store (a 0600 file with
the files store, encrypted in etcd) keeps only its sha256, its name, its role and when it
expires. A sha256 of 256 random bits gives no token back, but the document is kept as a
secret all the same: it tells who may do what and until when, and a reader of the store need
not know that. Roles grow: a reader reads, an operator
also powers, builds and reprovisions, an admin also changes the inventory, secrets and
tokens (DESIGN.md section 6). Every write is a compare-and-swap of the whole document.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from provisiond.config import LABEL_RE, Config
from provisiond.errors import AlreadyExists, InvalidInput, NotFound, Unauthenticated
from provisiond.state import open as opening
from provisiond.state.layout import KEYS, Layout

TOKEN_BYTES = 32  # 256 bits from secrets.token_urlsafe: 43 characters
MAX_TOKEN_LENGTH = 200  # what a header may hold before it is taken for a token at all
REVOKED_KEPT = 1000  # revoked hashes remembered, so a revoked token is told apart (events)


class Role(IntEnum):
    """What a token may do; each role may do all that the smaller ones may."""

    READER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Role":
        try:
            return cls[str(text).upper()]
        except KeyError:
            raise InvalidInput(f"unknown role {text!r}: use reader, operator or admin",
                               field="role") from None


@dataclass(frozen=True)
class Principal:
    """Who made a request: a token's name and role."""

    name: str
    role: Role

    @property
    def actor(self) -> str:
        """The name the audit log and events give this principal."""
        return f"token:{self.name}"


class TokenRecord(BaseModel):
    """A stored token: never the token itself, only its sha256."""

    model_config = ConfigDict(extra="forbid")

    name: str
    role: str
    sha256: str
    created: float
    expires: float | None = None

    def public(self) -> dict:
        """What may be shown: everything but the hash."""
        return self.model_dump(exclude={"sha256"})


class TokenFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: dict[str, TokenRecord] = {}
    revoked: dict[str, str] = {}  # sha256 -> the name it had


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


KEY = str(KEYS.tokens)


class TokenStore:
    """`tokens.json` on the store: parsed at most once per revision of it, written by
    compare-and-swap. Read with each request through `reads` (a server's WatchedCopy: no
    request on etcd), else from the store; a token it does not know is looked up on the
    store before it is refused (a copy may not hold yet one made a moment ago)."""

    def __init__(self, config: Config, reads=None):
        self.store = opening.open_store(config)
        self.reads = reads or self.store
        self.path = Layout.of(config).tokens  # what messages name
        self._revision: int | None = None
        self._data = TokenFile()

    def read(self, reads=None) -> TokenFile:
        entry = (reads or self.store).get(KEY)
        if entry is None:
            return TokenFile()
        if entry.revision != self._revision:
            self._data, self._revision = _load(self.path, entry.value), entry.revision
        return self._data

    def create(self, name: str, role: Role, expires_in: float | None = None
               ) -> tuple[str, TokenRecord]:
        """A new token named `name` (a DNS label, unique): (the token, its record). The token
        is returned here only; nothing can show it again."""
        check_token_name(name)
        if expires_in is not None and not 0 < expires_in <= 10 * 365 * 86400:
            raise InvalidInput("expiry must be between 0 and 10 years", field="expires_in")
        token = secrets.token_urlsafe(TOKEN_BYTES)
        now = time.time()
        record = TokenRecord(name=name, role=role.label, sha256=token_hash(token), created=now,
                             expires=None if expires_in is None else now + expires_in)
        def add(data: TokenFile) -> None:
            if name in data.tokens:
                raise AlreadyExists(f"a token named {name!r} exists (revoke it first)",
                                    field="name")
            data.tokens[name] = record

        self._edit(add)
        return token, record

    def revoke(self, name: str) -> TokenRecord:
        revoked: list[TokenRecord] = []

        def remove(data: TokenFile) -> None:
            record = data.tokens.pop(name, None)
            if record is None:
                raise NotFound(f"no token named {name!r}")
            data.revoked[record.sha256] = name
            while len(data.revoked) > REVOKED_KEPT:
                data.revoked.pop(next(iter(data.revoked)))
            revoked[:] = [record]

        self._edit(remove)
        return revoked[0]

    def list(self) -> list[TokenRecord]:
        return sorted(self.read().tokens.values(), key=lambda r: r.name)

    def authenticate(self, token: str) -> Principal:
        """The principal a token stands for; TokenRefused if it is unknown, revoked or
        expired."""
        if not token or len(token) > MAX_TOKEN_LENGTH:
            raise TokenRefused("unknown", None)
        digest = token_hash(token)
        data = self.read(self.reads)
        record = _by_hash(data, digest)
        if record is None and self.reads is not self.store:
            data = self.read()
            record = _by_hash(data, digest)
        if record is None:
            revoked = data.revoked.get(digest)
            raise TokenRefused("revoked" if revoked else "unknown", revoked)
        if record.expires is not None and record.expires <= time.time():
            raise TokenRefused("expired", record.name)
        return Principal(record.name, Role.parse(record.role))

    def _edit(self, change: Callable[[TokenFile], None]) -> None:
        """Apply `change` to the stored tokens (again if another wrote meanwhile); an error
        from it writes nothing."""
        def apply(raw: bytes | None) -> bytes:
            data = _load(self.path, raw) if raw is not None else TokenFile()
            change(data)
            return json.dumps(data.model_dump(mode="json"), indent=1, sort_keys=True).encode()

        self.store.update(KEY, apply)


def _by_hash(data: TokenFile, digest: str) -> TokenRecord | None:
    return next((r for r in data.tokens.values() if r.sha256 == digest), None)


class TokenRefused(Unauthenticated):
    """A token was given but is unknown, revoked or expired: `reason` says which, `name`
    is the token's name when known (for the auth.denied event)."""

    def __init__(self, reason: str, name: str | None):
        super().__init__(f"the bearer token is {reason}")
        self.reason, self.name = reason, name


def check_token_name(name: str) -> str:
    if not isinstance(name, str) or not LABEL_RE.fullmatch(name):
        raise InvalidInput(f"invalid token name {name!r}: use lowercase letters, digits and "
                           "'-' (a DNS label)", field="name")
    return name


def _load(path: Path, raw: bytes) -> TokenFile:
    try:
        return TokenFile.model_validate_json(raw)
    except ValidationError:
        raise InvalidInput(f"{path}: not a token file") from None
