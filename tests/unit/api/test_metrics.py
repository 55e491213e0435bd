"""GET /metrics and the HTTP requests it counts (in-process: the counters of this process;
tests/integration/api/test_metrics_serve.py reads those of a real serve's processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bootdata import add_blob, add_image, add_nodes, credential, ip_of, mac_of, node_env
from provisiond.api import create_app, gunicorn_conf
from provisiond.auth import Role
from provisiond.config import load_config
from provisiond.metrics import record_outcomes
from provisiond.states import NodePhase
from provisiond.status import record_phase
from tests.conftest import run_provisiond
from tests.prometheus_text import by_label, parse
from v1helpers import Api, assert_error


@pytest.fixture
def app(config, live_metrics):
    add_nodes(config, 2)
    add_image(config, "tiny")  # the nodes' iPXE scripts (and their tokens) need it
    app = create_app(config)
    app.wsgi_app = KeepEnviron(app.wsgi_app)
    return app


class KeepEnviron:
    """The WSGI environ of the last request, as gunicorn hands it to post_request."""

    def __init__(self, app):
        self.app, self.environ = app, None

    def __call__(self, environ, start_response):
        self.environ = environ
        return self.app(environ, start_response)


def scrape(client) -> dict[tuple, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=")
    return parse(response.get_data(as_text=True))


def served(client, method: str, url: str, **kwargs):
    """A request as gunicorn serves it: answered, then its post_request hook."""
    response = client.open(url, method=method, **kwargs)
    body = response.get_data()
    gunicorn_conf.post_request(None, None, client.application.wsgi_app.environ, SimpleNamespace(
        status_code=response.status_code, sent=len(body), response_length=None))
    return response


def http_requests(seen: dict) -> dict[tuple, float]:
    return {dict(labels)["route"] + " " + dict(labels)["method"] + " " + dict(labels)["status"]:
            value for (name, labels), value in seen.items()
            if name == "provisiond_http_requests_total"}


def test_requests_are_counted_by_route_never_by_url(app, config):
    client = app.test_client()
    digest = add_blob(config, b"z" * 3000)[7:]
    served(client, "GET", f"/blobs/sha256/{digest}")  # the fast path, in front of Flask
    served(client, "GET", f"/blobs/sha256/{digest}", headers={"Range": "bytes=0-9"})  # Flask
    served(client, "GET", f"/boot/ipxe/{mac_of(1)}", environ_base={"REMOTE_ADDR": ip_of(1)})
    app.extensions["provisiond"].phases.flush()  # its ipxe phase counted now, in this test
    served(client, "GET", "/no/such/thing")
    served(client, "BREW", "/boot/ipxe")
    seen = scrape(client)
    assert http_requests(seen) == {
        "/blobs/sha256/<hexdigest> GET 200": 1, "/blobs/sha256/<hexdigest> GET 206": 1,
        "/boot/ipxe/<mac> GET 200": 1, "unmatched GET 404": 1, "unmatched other 405": 1}
    assert seen["provisiond_http_response_bytes_total",
                (("route", "/blobs/sha256/<hexdigest>"),)] == 3000 + 10
    assert seen["provisiond_http_request_duration_seconds_count",
                (("route", "/boot/ipxe/<mac>"),)] == 1
    text = client.get("/metrics").get_data(as_text=True)
    assert digest not in text and mac_of(1) not in text and "/no/such" not in text


def test_phases_are_counted_and_timed_from_dhcp(app, config):
    """dhcp as the DHCP server records it, ipxe as the script's request does, booted as the
    node reports it (with its credential)."""
    client = app.test_client()
    record_phase(config, "n1", NodePhase.DHCP)
    headers = credential(client, 1)  # the node's agent: its iPXE script's token exchanged
    app.extensions["provisiond"].phases.flush()
    answer = served(client, "POST", "/api/v1/status/n1", data={"phase": "booted"},
                    headers=headers, environ_base=node_env(1))
    assert answer.status_code == 200, answer.json
    seen = scrape(client)
    assert by_label(seen, "provisiond_boot_phases_total", "phase") == {
        "dhcp": 1, "ipxe": 1, "booted": 1}
    assert seen["provisiond_boot_phase_seconds_count", (("phase", "booted"),)] == 1
    assert ("provisiond_boot_phase_seconds_count", (("phase", "dhcp"),)) not in seen


def test_builds_and_bmc_calls_other_processes_recorded_are_shown(app, config):
    record_outcomes(config, "build_duration_seconds", [(("overlays", "ok"), 2.0)])
    record_outcomes(config, "bmc_call_duration_seconds", [(("redfish", "BmcUnreachable"), 20.5)])
    seen = scrape(app.test_client())
    assert seen["provisiond_build_duration_seconds_sum",
                (("kind", "overlays"), ("outcome", "ok"))] == 2.0
    assert seen["provisiond_bmc_call_duration_seconds_count",
                (("driver", "redfish"), ("outcome", "BmcUnreachable"))] == 1


def test_metrics_holds_no_secret(app, config):
    stored = run_provisiond(config.state_dir, "secret", "set", "node", "n1", "bmc_password",
                            input="hunter2-very-secret\n")
    assert stored.returncode == 0, stored.stderr
    client = app.test_client()
    answer = served(client, "POST", "/api/v1/status/n1", data={
        "phase": "failed", "detail": "token=hunter2-very-secret"},
        headers=credential(client, 1), environ_base=node_env(1))
    assert answer.status_code == 200, answer.json
    text = client.get("/metrics").get_data(as_text=True)
    assert 'provisiond_boot_phases_total{phase="failed"} 1.0' in text
    assert "hunter2" not in text and "n1" not in text  # no details, no per-node labels


def test_metrics_can_require_a_reader_token(config, live_metrics):
    (config.state_dir / "provisiond.yaml").write_text("metrics:\n  require_token: true\n")
    api = Api(load_config(config.state_dir))
    assert api.call(None, "GET", "/metrics").headers["WWW-Authenticate"].startswith("Bearer")
    assert_error(api.call(None, "GET", "/metrics"), 401, "unauthenticated")
    for role in Role:
        response = api.call(role, "GET", "/metrics")
        assert response.status_code == 200 and b"provisiond_http_requests_total" in response.data


def test_metrics_are_open_by_default(app):
    assert app.test_client().get("/metrics").status_code == 200
