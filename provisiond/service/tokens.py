"""API tokens for the CLI (`provisiond token`) and the API (`/api/v1/tokens`): made,
listed and revoked with an audit record; a token is shown once, when made."""

from __future__ import annotations

from provisiond.auth import Role, TokenStore
from provisiond.config import Config
from provisiond.service.journal import audit


def create_token(config: Config, actor: str, name: str, role: Role,
                 expires_in: float | None = None) -> tuple[str, dict]:
    """(the new token, its public record)."""
    token, record = TokenStore(config).create(name, role, expires_in)
    audit(config, actor, "token.create", f"token:{name}", {"role": role.label})
    return token, record.public()


def list_tokens(config: Config) -> list[dict]:
    return [record.public() for record in TokenStore(config).list()]


def revoke_token(config: Config, actor: str, name: str) -> dict:
    record = TokenStore(config).revoke(name)
    audit(config, actor, "token.revoke", f"token:{name}")
    return record.public()
