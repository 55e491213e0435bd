"""Secrets for the CLI and the API: write-only. A value can be set or removed, a generated
one (ssh host keys) made anew, and which keys each record has can be listed; no call here
returns a value."""

from __future__ import annotations

import re

from provisiond.config import Config
from provisiond.errors import InvalidInput, SecretNotFound
from provisiond.inventory.ranges import fold
from provisiond.inventory.secrets import BMC_PASSWORD, GENERATED, SecretStore
from provisiond.inventory.values import check_text
from provisiond.lifecycle import rotate_secrets
from provisiond.overlays import build_overlays
from provisiond.service.inventory import Kind, snapshot
from provisiond.service.journal import audit, emit
from provisiond.inventory.ranges import names_head, names_text

__all__ = ["BMC_PASSWORD", "set_secret", "rotate_secret", "list_secrets", "check_key"]
MAX_VALUE = 16 << 10
MIN_BYTES = {"munge.key": 32}
"""Keys whose consumer refuses a shorter value (munged 0.5: "Keyfile must be at least 32
bytes"), so the node would boot without it working."""
KEY_RE = re.compile(r"[A-Za-z0-9_.-]{1,63}")


def check_key(key: str) -> str:
    """A secret's key: letters, digits, '_', '.', '-' (as a tag's name), and not the name
    of a secret provisiond makes (templates read those under that name)."""
    if not KEY_RE.fullmatch(key):
        raise InvalidInput(f"invalid secret key {key[:70]!r}: use letters, digits, '_', '.' "
                           "and '-' (at most 63)", field="key")
    if key in GENERATED:
        raise InvalidInput(f"secret key {key!r} is made by provisiond (see `provisiond "
                           "secret rotate`)", field="key")
    return key


def set_secret(config: Config, actor: str, kind: Kind, names: list[str], key: str,
               value: str | None) -> list[str]:
    """Set `key` to `value` (None: remove it) for each named, existing record. Returns
    the names set, or those it was removed from; removing it from records none of which
    has it is SecretNotFound, and nothing is written or recorded."""
    check_key(key)
    if value is not None:
        _check_value(value)
        _check_length(key, value)
    stored = kind.records(snapshot(config).inventory)
    missing = [n for n in names if n not in stored]
    if missing:
        raise kind.not_found(f"no such {kind.noun}: {fold(missing)}")
    changed = SecretStore(config).set(kind.key, names, key, value)
    if value is None:
        if not changed:
            raise SecretNotFound(f"no secret {key} is set for {kind.noun} {fold(names)}: "
                                 "nothing to remove (`provisiond secret list` shows which "
                                 "records hold it)", field="key")
        names = changed
    target = f"{kind.noun}:{names_text(names, kind.noun)}"
    audit(config, actor, "secret.set" if value is not None else "secret.unset", target,
          [key])
    emit(config, "secret.changed", target, {"kind": kind.noun, "names": names_head(names),
                                            "count": len(names), "keys": [key],
                                            "removed": value is None})
    return names


def rotate_secret(config: Config, actor: str, names: list[str], what: str) -> dict:
    """Make the named nodes' generated secret `what` anew (recorded and announced, the
    name only), then rebuild their runtime overlays, which running nodes take at their
    agent's next refresh. The build's summary."""
    rotate_secrets(config, names, what)
    target = f"node:{names_text(names, 'node')}"
    audit(config, actor, "secret.rotate", target, [what])
    emit(config, "secret.changed", target, {"kind": "node", "names": names_head(names),
                                            "count": len(names), "keys": [what],
                                            "rotated": True})
    return build_overlays(config, names, kinds=("runtime",))


def list_secrets(config: Config) -> list[dict]:
    """[{kind, name, keys}] for every record holding a secret, profiles first."""
    data = SecretStore(config).read()
    return [{"kind": kind[:-1], "name": name, "keys": sorted(keys)}
            for kind in ("profiles", "nodes")
            for name, keys in sorted((data.get(kind) or {}).items())]


def _check_length(key: str, value: str) -> None:
    least = MIN_BYTES.get(key)
    if least and len(value.encode()) < least:
        raise InvalidInput(f"{key} must be at least {least} bytes, this one has "
                           f"{len(value.encode())} (e.g. `openssl rand -hex 32`)",
                           field="value")


def _check_value(value: str) -> None:
    if not value:
        raise InvalidInput("a secret's value cannot be empty", field="value")
    if len(value) > MAX_VALUE:
        raise InvalidInput(f"a secret's value is at most {MAX_VALUE} characters",
                           field="value")
    try:
        check_text(value.replace("\n", " "))  # lines: key files reach runtime templates
    except ValueError:  # its message would quote the value
        raise InvalidInput("a secret's value cannot hold control characters (line ends "
                           "aside)", field="value") from None
