"""`/api/v1/secrets`: write-only secrets (admins). A value can be set or removed, and which
keys each record has can be listed; no answer ever holds a value."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import NodeRange, Page, Role, config, route
from provisiond.errors import NotFound
from provisiond.service import secrets
from provisiond.service.inventory import MAX_API_NAMES, NODES, PROFILES, snapshot

RULE = "/secrets/<kind>/<names>/<key>"


class SecretKeys(BaseModel):
    kind: Literal["node", "profile"]
    name: str
    keys: list[str]


class SecretPath(BaseModel):
    kind: Literal["nodes", "profiles"]
    names: NodeRange = Field(description="a node range or a profile's name")
    key: str = Field(pattern=f"^{secrets.KEY_RE.pattern}$")


class SecretValue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(min_length=1, max_length=secrets.MAX_VALUE,
                       description="stored 0600 apart from the inventory; never returned")


@route("/secrets", "GET", role=Role.ADMIN, summary="Which records hold which secret keys",
       response=Page[SecretKeys])
def list_secrets(principal, body, query):
    return {"items": secrets.list_secrets(config()), "continue": None}


@route(RULE, "PUT", role=Role.ADMIN, summary="Set a secret of nodes (a range) or a profile",
       body=SecretValue, status=204, path=SecretPath)
def set_secret(principal, body: SecretValue, query, kind: str, names: str, key: str):
    record_kind, found = _records(kind, names)
    secrets.set_secret(config(), principal.actor, record_kind, found, key, body.value)


@route(RULE, "DELETE", role=Role.ADMIN, summary="Remove a secret", status=204,
       path=SecretPath)
def unset_secret(principal, body, query, kind: str, names: str, key: str):
    """Remove the key from those of the records that have it; none has it: 404, nothing
    written."""
    record_kind, found = _records(kind, names)
    secrets.set_secret(config(), principal.actor, record_kind, found, key, None)


def _records(kind: str, names: str):
    record_kind = {"nodes": NODES, "profiles": PROFILES}.get(kind)
    if record_kind is None:
        raise NotFound(f"no secrets of {kind[:20]!r}: use nodes or profiles", field="kind")
    return record_kind, record_kind.existing(snapshot(config()).inventory, names,
                                             MAX_API_NAMES)
