"""`provisiond serve` with the API on a listener of its own (api.bind) with TLS, beside the
boot listener, on loopback; its log as JSON lines, with no secret in them. The certificate
is a self-signed one made here with `cryptography`."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from cryptography import x509

from bootdata import add_blob, add_image, add_nodes, mac_of
from provisiond.config import load_config
from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore
from servers import REPO, free_port, start_serve, stop_serve, wait_http, write_config
from tests.certs import self_signed

TOKEN = "pvd_Zq8t3XkVw0aBcDeF1234567890secret"
BMC_SECRET = "bmc-pw-Kx81nQ"

CLIENT_TIMEOUT = 10  # http.client_timeout here (default 30): the API listener too

@pytest.fixture(scope="module")
def apart(tmp_path_factory):
    """serve with the boot listener on one port and the API (TLS) on another, JSON logs at
    DEBUG; yields the URLs, the TLS context trusting the certificate, and the log path."""
    root = tmp_path_factory.mktemp("listeners")
    state = root / "state"
    cert, key = map(str, self_signed(root, stem="api"))
    ports = {"http": free_port(), "api": free_port()}
    (state).mkdir()
    (state / "provisiond.yaml").write_text("{}\n")
    write_config(state, http={"bind": "127.0.0.1", "port": ports["http"], "workers": 1,
                              "client_timeout": CLIENT_TIMEOUT},
                 api={"bind": "127.0.0.1", "port": ports["api"], "tls_cert": cert,
                      "tls_key": key},
                 log={"level": "DEBUG", "format": "json"})
    config = load_config(state)
    add_nodes(config, 2)
    add_image(config, "tiny")
    SecretStore(config).set("nodes", ["n1", "n2"], BMC_PASSWORD, BMC_SECRET)
    digest = add_blob(config, b"a layer").split(":")[1]
    made = subprocess.run([sys.executable, "-m", "provisiond", "--state-dir", str(state),
                           "token", "create", "--role", "reader", "--name", "dashboard"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    token = made.stdout.strip()
    assert made.returncode == 0 and token, made.stderr
    log_path = root / "serve.log"
    proc = start_serve(state, log_path=log_path)
    boot = f"http://127.0.0.1:{ports['http']}"
    api = f"https://127.0.0.1:{ports['api']}"
    tls = ssl.create_default_context(cafile=cert)
    try:
        wait_http(f"{boot}/boot/ipxe", proc)
        _wait_tls(f"{api}/api/v1/openapi.json", tls, proc)
        yield {"boot": boot, "api": api, "tls": tls, "log": log_path, "proc": proc,
               "digest": digest, "config": config, "token": token}
    finally:
        stop_serve(proc)


def _wait_tls(url: str, tls, proc, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"serve exited {proc.returncode}"
        try:
            urllib.request.urlopen(url, context=tls, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def fetch(url: str, tls=None, method: str = "GET", data: bytes | None = None,
          headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, context=tls, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_api_answers_over_tls_with_the_configured_certificate(apart):
    status, body = fetch(f"{apart['api']}/api/v1/status", apart["tls"],
                         headers={"Authorization": f"Bearer {apart['token']}"})
    assert status == 200 and "items" in json.loads(body), body
    host, port = apart["api"].removeprefix("https://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with apart["tls"].wrap_socket(raw, server_hostname=host) as conn:
            served = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
    assert served.subject.rfc4514_string() == "CN=provisiond test"


def test_the_api_listener_speaks_no_plain_http(apart):
    host, port = apart["api"].removeprefix("https://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/api/v1/openapi.json")
        answer = conn.getresponse()
        assert answer.status == 400  # gunicorn refuses a plain request on a TLS port
    except (ConnectionError, http.client.HTTPException):
        pass  # or drops it
    finally:
        conn.close()


@pytest.mark.slow  # 30 s: the server's socket timeout
def test_a_client_silent_in_the_tls_handshake_is_disconnected(apart):
    """gevent does the handshake before the worker's handle(): without a default timeout a
    client that connects and says nothing held its connection slot for good."""
    host, port = apart["api"].removeprefix("https://").split(":")
    with socket.create_connection((host, int(port)), timeout=90) as sock:
        started = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server (a timeout here raises)
        waited = time.monotonic() - started
    assert CLIENT_TIMEOUT - 1 < waited < CLIENT_TIMEOUT + 15, waited  # http.client_timeout
    assert fetch(f"{apart['api']}/api/v1/openapi.json", apart["tls"])[0] == 200


def test_boot_routes_stay_on_the_boot_listener(apart):
    boot, api, tls = apart["boot"], apart["api"], apart["tls"]
    assert fetch(f"{boot}/boot/ipxe/{mac_of(1)}")[0] == 200
    assert fetch(f"{boot}/blobs/sha256/{apart['digest']}")[1] == b"a layer"
    for path in (f"/boot/ipxe/{mac_of(1)}", f"/blobs/sha256/{apart['digest']}",
                 "/overlays/n1/shared", "/boot/files/undionly.kpxe"):
        status, body = fetch(f"{api}{path}", tls)
        assert status == 404 and b"boot listener only" in body, (path, body)


def test_the_api_is_not_on_the_boot_network_but_node_reports_are(apart):
    boot = apart["boot"]
    status, body = fetch(f"{boot}/api/v1/openapi.json")
    assert status == 404 and apart["api"].encode() in body, body
    assert fetch(f"{boot}/")[0] == 404
    report = fetch(f"{boot}/api/v1/status/n2", method="POST", data=b"phase=booted",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    # the node-report route answers there (it wants the node's credential), not a 404
    assert report[0] == 401 and b"node's credential" in report[1], report
    exchange = fetch(f"{boot}/api/v1/credentials/n2", method="POST", data=b"token=forged",
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    # the credential exchange too: a node boots on this network (refused here: no token)
    assert exchange[0] == 401 and b"token" in exchange[1], exchange


def test_every_log_line_is_json_with_a_level_and_none_holds_a_secret(apart):
    for token in (TOKEN, apart["token"]):  # an unknown token and a real one
        fetch(f"{apart['api']}/api/v1/nodes?token={token}", apart["tls"],
              headers={"Authorization": f"Bearer {token}"})
        fetch(f"{apart['boot']}/boot/ipxe/{mac_of(2)}?token={token}",
              headers={"Authorization": f"Bearer {token}"})
    stop_serve(apart["proc"])  # every buffered line written
    lines = apart["log"].read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # gunicorn's own lines too
    assert {e["level"] for e in entries} >= {"INFO"} and all(e["logger"] for e in entries)
    assert any("Booting worker" in e["message"] for e in entries)
    # plain HTTP on the TLS port (an earlier test) is the client's fault, not an error
    assert not [e for e in entries if e["level"] == "ERROR"], lines
    assert any(e["message"].startswith("n2 ipxe-script 200") for e in entries), lines
    text = apart["log"].read_text()
    assert TOKEN not in text and apart["token"] not in text and BMC_SECRET not in text


@pytest.mark.parametrize("change, words", [
    ({"tls_cert": "relative.crt", "tls_key": "/k"}, "an absolute path"),
    ({"tls_cert": "/nonexistent.crt", "tls_key": "/nonexistent.key"}, "cannot read"),
    ({"tls_cert": "__garbage__", "tls_key": "__key__"}, "not a PEM certificate"),
])
def test_bad_tls_settings_stop_serve_in_one_line_before_it_starts(tmp_path, change, words):
    cert, key = map(str, self_signed(tmp_path, stem="api"))
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    change = {k: {"__garbage__": str(garbage), "__key__": key}.get(v, v)
              for k, v in change.items()}
    state = tmp_path / "state"
    state.mkdir()
    (state / "provisiond.yaml").write_text(json.dumps(
        {"http": {"bind": "127.0.0.1", "port": free_port()},
         "api": {"bind": "127.0.0.1", "port": free_port(), **change}}))
    proc = subprocess.run([sys.executable, "-m", "provisiond", "--state-dir", str(state),
                           "serve"], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
