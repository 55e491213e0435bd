"""What the /api/v1 tests share: an app on a real state dir and a token per role."""

from __future__ import annotations

from provisiond.api import create_app
from provisiond.auth import Role, TokenStore


class Api:
    """A Flask test client with one token per role; `call(role, method, path, ...)`."""

    def __init__(self, config):
        self.config = config
        self.app = create_app(config)
        self.client = self.app.test_client()
        store = TokenStore(config)
        self.tokens = {role: store.create(f"test-{role.label}", role)[0] for role in Role}

    def headers(self, role: Role | None, extra: dict | None = None) -> dict:
        headers = dict(extra or {})
        if role is not None:
            headers["Authorization"] = f"Bearer {self.tokens[role]}"
        return headers

    def call(self, role: Role | None, method: str, path: str, headers=None, **kwargs):
        return self.client.open(path, method=method, headers=self.headers(role, headers),
                                **kwargs)


def assert_error(response, status: int, code: str, field: str | None = None) -> dict:
    """The answer is the one error shape with this status and code (and field)."""
    assert response.status_code == status, (response.status_code, response.data[:300])
    assert response.is_json, response.data[:300]
    error = response.json["error"]
    assert set(response.json) == {"error"} and set(error) == {"code", "message", "field"}
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    if field is not None:
        assert error["field"] == field, error
    return error
