"""The /api/v1 framework through Flask's test client on a real state dir: bearer tokens and
roles, the one error shape for each kind of bad input, and the OpenAPI document."""

import re
import time

import pytest

from provisiond import events
from provisiond.api.v1 import DENIED_EVENTS, DENIED_WINDOW, DeniedEvents
from provisiond.auth import Role, TokenStore
from v1helpers import Api, assert_error


@pytest.fixture
def api(config):
    return Api(config)


def stored_tokens(config) -> set[str]:
    return {record.name for record in TokenStore(config).list()}


def test_no_token_is_401_with_a_bearer_challenge(api):
    for headers in ({}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Bearer "}):
        response = api.client.get("/api/v1/tokens", headers=headers)
        assert_error(response, 401, "unauthenticated")
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_unknown_revoked_and_expired_tokens_are_401(api, config):
    store = TokenStore(config)
    assert_error(api.client.get("/api/v1/tokens", headers={"Authorization": "Bearer nope"}),
                 401, "unauthenticated")
    token, _ = store.create("short-lived", Role.ADMIN, expires_in=0.5)
    headers = {"Authorization": f"Bearer {token}"}
    assert api.client.get("/api/v1/tokens", headers=headers).status_code == 200
    deadline = time.time() + 10
    while time.time() < deadline and store.read().tokens["short-lived"].expires > time.time():
        time.sleep(0.1)
    assert "expired" in assert_error(api.client.get("/api/v1/tokens", headers=headers),
                                     401, "unauthenticated")["message"]
    token, _ = store.create("to-revoke", Role.ADMIN)
    headers = {"Authorization": f"Bearer {token}"}
    assert api.client.get("/api/v1/tokens", headers=headers).status_code == 200
    store.revoke("to-revoke")
    assert "revoked" in assert_error(api.client.get("/api/v1/tokens", headers=headers),
                                     401, "unauthenticated")["message"]


@pytest.mark.parametrize("content", [b"{not json", b'{"tokens": 5}'])
def test_an_unreadable_token_store_is_the_servers_error_not_the_clients(api, config, caplog,
                                                                        content):
    """It was a 400 invalid_input naming the server's state dir to every client."""
    (config.state_dir / "tokens.json").write_bytes(content)
    response = api.call(Role.READER, "GET", "/api/v1/nodes")
    error = assert_error(response, 500, "internal")
    assert str(config.state_dir) not in error["message"] and "token store" in error["message"]
    assert "tokens.json: not a token file" in caplog.text
    assert api.call(None, "GET", "/api/v1/openapi.json").status_code == 200  # open routes


def test_a_loop_of_bad_tokens_does_not_fill_the_event_journal(api, config):
    """Each refused token was an auth.denied event: any client could push every inventory
    and phase event out of the bounded journal (SSE clients then resume into a gap)."""
    bad = {"Authorization": "Bearer not-a-token"}
    for _ in range(DENIED_EVENTS + 30):
        assert_error(api.client.get("/api/v1/nodes", headers=bad), 401, "unauthenticated")
    other = api.client.get("/api/v1/nodes", headers=bad,
                           environ_base={"REMOTE_ADDR": "127.0.0.9"})
    assert other.status_code == 401
    denied = [e for e in events.read_since(config, 0) if e.kind == "auth.denied"]
    addresses = [e.data["address"] for e in denied]
    assert addresses.count("127.0.0.1") == DENIED_EVENTS and addresses.count("127.0.0.9") == 1


def test_denied_events_start_again_after_their_window():
    limiter = DeniedEvents()
    assert all(limiter.allow("a", 0.0) for _ in range(DENIED_EVENTS))
    assert not limiter.allow("a", 1.0) and limiter.allow("b", 1.0)
    assert limiter.allow("a", DENIED_WINDOW + 0.5)


def test_tokens_need_the_admin_role(api):
    for role in (Role.READER, Role.OPERATOR):
        assert_error(api.call(role, "GET", "/api/v1/tokens"), 403, "forbidden")
        response = api.call(role, "POST", "/api/v1/tokens", json={"name": "x", "role": "admin"})
        assert_error(response, 403, "forbidden")
        assert_error(api.call(role, "DELETE", "/api/v1/tokens/test-admin"), 403, "forbidden")
    assert "x" not in stored_tokens(api.config)
    listing = api.call(Role.ADMIN, "GET", "/api/v1/tokens").json
    assert [t["name"] for t in listing["items"]] == ["test-admin", "test-operator",
                                                     "test-reader"]
    assert all(set(t) == {"name", "role", "created", "expires"} for t in listing["items"])


def test_an_admin_makes_a_token_shown_once_that_then_works_and_is_revoked(api, config):
    response = api.call(Role.ADMIN, "POST", "/api/v1/tokens",
                        json={"name": "netbox-sync", "role": "reader"})
    assert response.status_code == 201, response.json
    token = response.json["token"]
    assert response.json["role"] == "reader" and len(token) >= 40
    text = (config.state_dir / "tokens.json").read_text()
    assert token not in text and "netbox-sync" in text
    assert (config.state_dir / "tokens.json").stat().st_mode & 0o777 == 0o600
    headers = {"Authorization": f"Bearer {token}"}
    assert_error(api.client.get("/api/v1/tokens", headers=headers), 403, "forbidden")
    assert all("token" not in t for t in api.call(Role.ADMIN, "GET", "/api/v1/tokens")
               .json["items"])
    again = api.call(Role.ADMIN, "POST", "/api/v1/tokens",
                     json={"name": "netbox-sync", "role": "admin"})
    assert_error(again, 409, "already_exists", "name")
    assert api.call(Role.ADMIN, "DELETE", "/api/v1/tokens/netbox-sync").status_code == 204
    assert_error(api.client.get("/api/v1/tokens", headers=headers), 401, "unauthenticated")
    assert_error(api.call(Role.ADMIN, "DELETE", "/api/v1/tokens/netbox-sync"), 404,
                 "not_found")


@pytest.mark.parametrize("data,content_type,status,code,field", [
    (b'{"name": "a", "role": "reader"', "application/json", 400, "invalid_input", None),
    (b'{"name": "a", "role": "reader", "colour": 1}', "application/json", 400,
     "invalid_input", "colour"),
    (b'{"name": 5, "role": "reader"}', "application/json", 400, "invalid_input", "name"),
    (b'{"name": "a", "role": "root"}', "application/json", 400, "invalid_input", "role"),
    (b'{"name": "a", "role": "reader", "expires_in": NaN}', "application/json", 400,
     "invalid_input", None),
    (b'{"name": "a", "name": "b", "role": "reader"}', "application/json", 400,
     "invalid_input", "name"),
    (b'["a"]', "application/json", 400, "invalid_input", None),
    (b'"a"', "application/json", 400, "invalid_input", None),
    (b"\xff\xfe", "application/json", 400, "invalid_input", None),
    (b"[" * 100_000, "application/json", 413, "too_large", None),
    (b"[" * 60_000, "application/json", 400, "invalid_input", None),
    (b'{"name": "a", "role": "reader"}', "text/plain", 415, "unsupported_media_type", None),
    (b"name=a&role=reader", "application/x-www-form-urlencoded", 415,
     "unsupported_media_type", None),
    (b'{"name": "Bad Name", "role": "reader"}', "application/json", 400, "invalid_input",
     "name"),
    (b'{"name": "a", "role": "reader", "expires_in": -1}', "application/json", 400,
     "invalid_input", "expires_in"),
])
def test_bad_bodies_get_one_error_shape_and_store_nothing(api, data, content_type, status,
                                                          code, field):
    before = (api.config.state_dir / "tokens.json").read_bytes()
    response = api.call(Role.ADMIN, "POST", "/api/v1/tokens", data=data,
                        content_type=content_type)
    assert_error(response, status, code, field)
    assert (api.config.state_dir / "tokens.json").read_bytes() == before


def test_unknown_paths_and_methods_get_the_error_shape(api):
    assert_error(api.call(Role.ADMIN, "GET", "/api/v1/nothing"), 404, "not_found")
    response = api.call(Role.ADMIN, "PUT", "/api/v1/tokens")
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["Allow"]


def test_the_openapi_document_is_valid_openapi_3_1_from_the_registry(api):
    from openapi_spec_validator import validate
    from provisiond.api.v1 import OPERATIONS

    response = api.client.get("/api/v1/openapi.json")  # open: no token
    assert response.status_code == 200
    document = response.json
    validate(document)  # raises on anything that is not OpenAPI 3.1
    assert document["openapi"] == "3.1.0"
    for op in OPERATIONS:
        path = "/api/v1" + re.sub(r"<([a-z_]+)>", r"{\1}", op.rule)
        item = document["paths"][path][op.method.lower()]
        assert item["summary"] == op.summary
        assert item["security"] == ([{"bearer": []}] if op.role else [])
    create = document["paths"]["/api/v1/tokens"]["post"]
    schema = create["requestBody"]["content"]["application/json"]["schema"]
    body = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    assert body["additionalProperties"] is False and set(body["required"]) == {"name", "role"}
    assert {"401", "403", "413", "415"} <= set(create["responses"])


@pytest.mark.parametrize("path", ["/api/v1/status/{node}", "/api/v1/credentials/{node}"])
def test_the_nodes_own_routes_declare_the_401_and_403_of_their_credential(api, path):
    """Open to nodes, but a report or an exchange without the node's credential or token is
    401/403: schemathesis found the answers undocumented."""
    responses = api.client.get("/api/v1/openapi.json").json["paths"][path]["post"]["responses"]
    assert {"401", "403"} <= set(responses)


def test_the_docs_page_renders_the_document_without_outside_resources(api):
    response = api.client.get("/api/v1/docs")
    assert response.status_code == 200 and response.mimetype == "text/html"
    page = response.get_data(as_text=True)
    assert 'fetch("openapi.json")' in page
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
