"""Tokens: random, stored only hashed in a 0600 file, names unique, expiry, revocation."""

import json
import time

import pytest

from provisiond.auth import Role, TokenRefused, TokenStore, token_hash
from provisiond.errors import AlreadyExists, InvalidInput, NotFound


def test_a_token_is_random_and_stored_only_as_its_sha256(config):
    store = TokenStore(config)
    first, record = store.create("netbox-sync", Role.OPERATOR)
    second, _ = store.create("ci", Role.OPERATOR)
    assert first != second and len(first) >= 43
    data = json.loads((config.state_dir / "tokens.json").read_text())
    assert data["tokens"]["netbox-sync"]["sha256"] == token_hash(first) == record.sha256
    assert first not in (config.state_dir / "tokens.json").read_text()
    assert (config.state_dir / "tokens.json").stat().st_mode & 0o777 == 0o600
    principal = store.authenticate(first)
    assert (principal.name, principal.role, principal.actor) == (
        "netbox-sync", Role.OPERATOR, "token:netbox-sync")


def test_names_are_unique_labels(config):
    store = TokenStore(config)
    store.create("ci", Role.READER)
    with pytest.raises(AlreadyExists):
        store.create("ci", Role.ADMIN)
    for bad in ("", "CI", "a b", "x" * 64, "a\nb"):
        with pytest.raises(InvalidInput):
            store.create(bad, Role.READER)
    assert [r.name for r in store.list()] == ["ci"]


def test_revoked_expired_and_unknown_tokens_are_refused_with_a_reason(config):
    store = TokenStore(config)
    token, _ = store.create("ci", Role.ADMIN)
    store.revoke("ci")
    with pytest.raises(TokenRefused) as refused:
        store.authenticate(token)
    assert (refused.value.reason, refused.value.name) == ("revoked", "ci")
    with pytest.raises(NotFound):
        store.revoke("ci")
    token, _ = store.create("ci", Role.ADMIN, expires_in=0.2)  # the name is free again
    deadline = time.time() + 10
    while time.time() < deadline and store.read().tokens["ci"].expires > time.time():
        time.sleep(0.05)
    with pytest.raises(TokenRefused) as refused:
        store.authenticate(token)
    assert (refused.value.reason, refused.value.name) == ("expired", "ci")
    for junk in ("", "x", "x" * 10_000):
        with pytest.raises(TokenRefused) as refused:
            store.authenticate(junk)
        assert refused.value.reason == "unknown"


def test_roles_are_ordered_and_parsed():
    assert Role.READER < Role.OPERATOR < Role.ADMIN
    assert Role.parse("operator") is Role.OPERATOR and Role.ADMIN.label == "admin"
    with pytest.raises(InvalidInput):
        Role.parse("root")


def test_a_second_store_sees_changes_made_by_another(config):
    """Each HTTP worker holds its own store: a token made or revoked by the CLI is seen."""
    reader, writer = TokenStore(config), TokenStore(config)
    assert reader.list() == []
    token, _ = writer.create("ci", Role.READER)
    assert reader.authenticate(token).name == "ci"
    writer.revoke("ci")
    with pytest.raises(TokenRefused):
        reader.authenticate(token)
