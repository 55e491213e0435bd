"""What a store key may be, and which keys hold secrets (both backends use these)."""

from __future__ import annotations

from provisiond.errors import InvalidInput, StaleRevision
from provisiond.state.store import ABSENT

SECRET_FILES = frozenset({"secrets.yaml", "tokens.json"})
SECRET_DIRS = ("secrets/",)
SECRET_SUFFIXES = {"jobs/": ".secret"}  # a job's params with a URL's credentials
"""Keys whose values are secret: their files are 0600 (as provisiond wrote them before the
store), and the etcd backend encrypts their values (provisiond.state.crypt)."""

MAX_KEY = 1024


def check_key(key: str) -> str:
    """`key` if it is a relative POSIX path of plain names, else InvalidInput. A name may
    not start with '.': the files backend keeps its temp files, locks and revisions in
    dot-names beside the values."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise InvalidInput(f"store key {key!r}: 1-{MAX_KEY} characters")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidInput(f"store key {key!r}: a relative path (no '/' first, no '\\', "
                           "no NUL)")
    for part in key.split("/"):
        if not part or part.startswith("."):
            raise InvalidInput(f"store key {key!r}: empty names, '.', '..' and names "
                               "starting with '.' are not allowed")
    return key


def check_prefix(prefix: str) -> str:
    """A prefix is a key, a key's start ('status/n0') or '' (everything)."""
    if prefix == "":
        return prefix
    check_key(prefix.removesuffix("/") or "/")
    return prefix


def is_secret(key: str) -> bool:
    return key in SECRET_FILES or key.startswith(SECRET_DIRS) or any(
        key.startswith(folder) and key.endswith(suffix)
        for folder, suffix in SECRET_SUFFIXES.items())


def file_mode(key: str) -> int:
    return 0o600 if is_secret(key) else 0o644


def check_expect(key: str, revision: int | None, expect: int | None) -> None:
    """StaleRevision unless a key at `revision` (None: absent) is what `expect` asks for
    (None: anything; ABSENT: no key)."""
    if expect is None or (revision or ABSENT) == expect:
        return
    now = "does not exist" if revision is None else f"is at revision {revision}"
    wanted = "not to exist" if expect == ABSENT else f"at revision {expect}"
    raise StaleRevision(f"{key} {now}, expected {wanted}")
