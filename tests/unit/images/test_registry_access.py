"""Registry logins, our own logic: the WWW-Authenticate challenge, --creds, which auth
files are read in which order and which entry wins, where credentials may be sent (stub
registries on loopback play the peers; tests/integration/test_registry_auth.py uses the
real docker-registry)."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from provisiond.errors import ExitCode, InvalidInput
from provisiond.images.layout import ImportFailed, LayoutWriter
from provisiond.images.registry import Client, parse_reference, pull
from provisiond.images import registry_access
from provisiond.images.registry_access import (Access, Credentials, auth_file_paths,
                                               cert_dir_files, find_credentials,
                                               parse_challenge, parse_creds,
                                               registry_cert_dir, tls_context)
from tests.tools import tool


@pytest.mark.parametrize("header, scheme, params", [
    ('Bearer realm="https://auth.example.org/token",service="registry.example.org",'
     'scope="repository:site/a:pull,push"', "bearer",
     {"realm": "https://auth.example.org/token", "service": "registry.example.org",
      "scope": "repository:site/a:pull,push"}),
    ('Basic realm="Registry Realm"', "basic", {"realm": "Registry Realm"}),
    ('basic realm=plain, charset="UTF-8"', "basic", {"realm": "plain", "charset": "UTF-8"}),
    (r'Bearer realm="a\"b", Service="s"', "bearer", {"realm": 'a"b', "service": "s"}),
    # several challenges: Bearer is answered, with its own realm, whatever the order
    ('Basic realm="Registry, or not", Bearer realm="https://a/token",service="s"', "bearer",
     {"realm": "https://a/token", "service": "s"}),
    ('Bearer realm="https://a/token",service="s", Basic realm="Registry"', "bearer",
     {"realm": "https://a/token", "service": "s"}),
    ('Negotiate YIIabc==, Basic realm="x"', "basic", {"realm": "x"}),
    ("", "", {}),
])
def test_challenges(header, scheme, params):
    challenge = parse_challenge(header)
    assert (challenge.scheme, challenge.params) == (scheme, params)


@pytest.mark.parametrize("text, user, password", [
    ("bob", "bob", None), ("bob:", "bob", ""), ("bob:a:b:c", "bob", "a:b:c")])
def test_creds(text, user, password):
    assert parse_creds(text) == (user, password)


def test_creds_without_a_user_are_refused():
    with pytest.raises(InvalidInput, match="--creds needs a user name"):
        parse_creds(":secret")


def test_a_password_is_not_in_the_repr():
    access = Access(credentials=Credentials("bob", "hunter2"))
    assert "hunter2" not in repr(access) and "bob" in repr(access)


HOME = Path("/home/u")


@pytest.mark.parametrize("authfile, environ, first", [
    (None, {}, []),
    (None, {"XDG_RUNTIME_DIR": "/run/user/1"}, ["/run/user/1/containers/auth.json"]),
    (None, {"XDG_RUNTIME_DIR": "/run/user/1", "REGISTRY_AUTH_FILE": "/etc/a.json"},
     ["/etc/a.json"]),
    (Path("/x.json"), {"XDG_RUNTIME_DIR": "/run/user/1", "REGISTRY_AUTH_FILE": "/etc/a.json"},
     ["/x.json"]),
])
def test_the_primary_auth_file(authfile, environ, first):
    paths = [str(p) for p in auth_file_paths(authfile, environ, HOME)]
    assert paths == first + ["/home/u/.config/containers/auth.json",
                             "/home/u/.docker/config.json", "/home/u/.dockercfg"]


def test_xdg_config_home_and_docker_config_move_their_files():
    paths = auth_file_paths(None, {"XDG_CONFIG_HOME": "/c", "DOCKER_CONFIG": "/d"}, HOME)
    assert [str(p) for p in paths] == ["/c/containers/auth.json", "/d/config.json",
                                       "/home/u/.dockercfg"]



@pytest.mark.parametrize("environ, paths", [
    ({}, []),
    ({"REGISTRY_AUTH_FILE": "/a.json", "XDG_CONFIG_HOME": "/c", "DOCKER_CONFIG": "/d"},
     ["/a.json", "/c/containers/auth.json", "/d/config.json"]),
])
def test_without_a_home_only_the_files_variables_name_are_searched(environ, paths):
    assert [str(p) for p in auth_file_paths(None, environ, None)] == paths


def test_no_home_directory_says_why(monkeypatch):
    monkeypatch.delenv("HOME")
    monkeypatch.setattr("pwd.getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    home, why = registry_access.home_directory()
    assert home is None and why.startswith("no home directory ($HOME is unset and user ID ")


def _auth(user: str, password: str) -> dict:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def _file(folder: Path, name: str, document) -> Path:
    path = folder / name
    path.write_text(json.dumps(document))
    return path


def test_the_most_specific_key_wins(tmp_path):
    path = _file(tmp_path, "auth.json", {"auths": {
        "reg.example:5000": _auth("host", "p1"), "reg.example:5000/site": _auth("ns", "p2"),
        "reg.example:5000/site/a": _auth("repo", "p3"), "other.example": _auth("x", "y")}})
    assert find_credentials((path,), "reg.example:5000", "site/a") == Credentials("repo", "p3")
    assert find_credentials((path,), "reg.example:5000", "site/b") == Credentials("ns", "p2")
    assert find_credentials((path,), "reg.example:5000", "lab/a") == Credentials("host", "p1")
    assert find_credentials((path,), "reg.example", "site/a") is None


def test_the_first_file_with_an_entry_wins_and_missing_files_are_skipped(tmp_path):
    first = _file(tmp_path, "first.json", {"auths": {"other.example": _auth("a", "b")}})
    second = _file(tmp_path, "second.json", {"auths": {"reg.example": _auth("bob", "p:w")}})
    third = _file(tmp_path, "third.json", {"auths": {"reg.example": _auth("eve", "x")}})
    files = (tmp_path / "missing.json", first, second, third)
    assert find_credentials(files, "reg.example", "a") == Credentials("bob", "p:w")


@pytest.mark.parametrize("key", ["https://index.docker.io/v1/", "docker.io",
                                 "index.docker.io"])
def test_docker_hub_keys(tmp_path, key):
    path = _file(tmp_path, "config.json", {"auths": {key: _auth("hub", "pw")}})
    assert find_credentials((path,), "registry-1.docker.io", "library/debian") == Credentials(
        "hub", "pw")


def test_a_legacy_dockercfg_has_no_auths_wrapper(tmp_path):
    path = _file(tmp_path, ".dockercfg", {"https://reg.example": _auth("old", "pw")})
    assert find_credentials((path,), "reg.example", "a") == Credentials("old", "pw")


@pytest.mark.parametrize("document, message", [
    ({"auths": {}, "credHelpers": {"reg.example": "ecr-login"}},
     "credHelpers names 'ecr-login' for reg.example; credential helpers are not supported"),
    ({"auths": {"reg.example": {}}, "credsStore": "desktop"},
     "credsStore 'desktop' holds the login for reg.example; credential helpers"),
    ({"auths": {"reg.example": {"identitytoken": "t"}}}, "holds an identity token"),
    ({"auths": {"reg.example": {"auth": "not base64!"}}},
     'the "auth" of reg.example is not base64 of USER:PASSWORD'),
    ({"auths": {"reg.example": {"auth": base64.b64encode(b"nocolon").decode()}}},
     "not base64 of USER:PASSWORD"),
    ({"auths": {"reg.example": "x"}}, "the entry for reg.example is not an object"),
    ({"auths": []}, '"auths" is not an object'),
    ([], "not a JSON object"),
])
def test_auth_files_that_cannot_serve_are_one_line(tmp_path, document, message):
    path = _file(tmp_path, "auth.json", document)
    with pytest.raises(InvalidInput, match=str(path)) as refused:
        find_credentials((path,), "reg.example", "a")
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_credential_store_with_no_entry_for_the_registry_is_passed_over(tmp_path):
    path = _file(tmp_path, "config.json", {"auths": {"other.example": {}},
                                           "credsStore": "desktop"})
    assert find_credentials((path,), "reg.example", "a") is None


def test_an_auth_file_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text("{")
    with pytest.raises(InvalidInput, match=f"auth file {path}: cannot read it as JSON"):
        find_credentials((path,), "reg.example", "a")


@pytest.fixture(autouse=True)
def no_certs_d_of_the_machine(monkeypatch, tmp_path):
    """The certs.d trees are the test's: nothing under /etc is read or written."""
    monkeypatch.setattr(registry_access, "CERTS_D", (tmp_path / "etc/containers/certs.d",
                                                     tmp_path / "etc/docker/certs.d"))


def _certs_d(tmp_path: Path, base: str, host: str, *names: str) -> Path:
    folder = tmp_path / "etc" / base / "certs.d" / host
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text("x")
    return folder


def test_the_registry_folder_of_the_first_certs_d_that_has_one_is_used(tmp_path):
    """containers-certs.d(5): /etc/containers/certs.d/HOST:PORT, else docker's; only one."""
    docker = _certs_d(tmp_path, "docker", "reg.example:5000", "ca.crt")
    assert registry_cert_dir(Access(), "reg.example:5000") == docker
    containers = _certs_d(tmp_path, "containers", "reg.example:5000", "site.crt")
    assert registry_cert_dir(Access(), "reg.example:5000") == containers
    assert registry_cert_dir(Access(), "reg.example") is None  # the port is in the name
    assert registry_cert_dir(Access(), "..") is None
    hub = _certs_d(tmp_path, "docker", "docker.io", "ca.crt")
    assert registry_cert_dir(Access(), "registry-1.docker.io") == hub
    assert registry_cert_dir(Access(cert_dir=docker), "reg.example:5000") == docker


def test_a_certs_d_folder_gives_cas_and_a_client_certificate(tmp_path):
    folder = _certs_d(tmp_path, "containers", "reg", "ca.crt", "b.crt", "README",
                      "z.cert", "z.key", "a.cert", "a.key")
    assert cert_dir_files(folder) == ((folder / "b.crt", folder / "ca.crt"),
                                      (folder / "a.cert", folder / "a.key"))
    assert cert_dir_files(None) == ((), None)


@pytest.mark.parametrize("names, message", [
    (("ca.crt", "client.cert"), "client.cert: a client certificate without its client.key "
                                "(CA certificates end in .crt)"),
    (("client.key",), "client.key: a client key without its client.cert"),
])
def test_half_a_client_certificate_is_one_line(tmp_path, names, message):
    folder = _certs_d(tmp_path, "docker", "reg:5000", *names)
    with pytest.raises(InvalidInput, match=re.escape(str(folder / message))) as refused:
        tls_context(Access(), "reg:5000")
    assert "\n" not in str(refused.value)


def test_a_cert_dir_that_cannot_serve_is_one_line(tmp_path):
    with pytest.raises(InvalidInput, match="--cert-dir .*/none: no such directory"):
        tls_context(Access(cert_dir=tmp_path / "none"), "reg")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="empty: no CA certificate"):
        tls_context(Access(cert_dir=tmp_path / "empty"), "reg")


def test_a_client_key_that_is_not_pem_is_one_line(tmp_path):
    _certs_d(tmp_path, "docker", "reg", "client.cert", "client.key")
    with pytest.raises(InvalidInput, match="client certificate .*client.cert and key "
                                           "client.key: cannot load them as PEM"):
        tls_context(Access(), "reg")


def test_a_ca_file_that_is_not_pem_is_one_line(tmp_path):
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(InvalidInput, match=f"CA file {tmp_path / 'ca.pem'}: cannot load"):
        tls_context(Access(ca_files=(tmp_path / "ca.pem",)), "reg")


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers each path from `server.routes` {path prefix: (status, headers, body)} and
    records (path, Authorization) of every request."""

    def do_GET(self):
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        path = urllib.parse.urlsplit(self.path).path
        status, headers, body = next(answer for prefix, answer in self.server.routes.items()
                                     if path.startswith(prefix))
        if callable(body):
            status, headers, body = body(self.headers.get("Authorization"))
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    """Two loopback HTTP servers (a registry and another host), each with routes."""
    started = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        server.routes, server.seen = {}, []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def _host(server) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


EMPTY = {"size": 2, "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c0"
                              "60f61caaff8a"}  # b"{}": every blob the stubs serve
MANIFEST = json.dumps({"schemaVersion": 2,
                       "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  **EMPTY},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                   **EMPTY}]}).encode()
BOB = Credentials("bob", "hunter2")


def _pull(server, tmp_path, credentials=None):
    reference = parse_reference(f"docker://{_host(server)}/site/a:1")
    return pull(reference, LayoutWriter(tmp_path / "layout"), Access(credentials=credentials))


def _needs(expected: str, ok):
    """A route body that answers `ok` to the expected Authorization, else 401 Basic."""
    def answer(authorization):
        if authorization == expected:
            return ok
        return 401, {"WWW-Authenticate": 'Basic realm="r"'}, b""
    return answer


def test_basic_credentials_answer_a_basic_challenge(servers, tmp_path):
    registry, _ = servers
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    registry.routes = {"/v2/site/a/manifests/": (0, {}, _needs(BOB.basic(), ok)),
                       "/v2/site/a/blobs/": (200, {}, b"{}")}
    with pytest.raises(ImportFailed, match="asks for a login"):
        _pull(registry, tmp_path / "anonymous")
    _pull(registry, tmp_path / "bob", BOB)
    assert registry.seen[-1] == ("/v2/site/a/blobs/" + json.loads(MANIFEST)["config"]["digest"],
                                 BOB.basic())


def test_a_refused_login_names_the_registry_and_the_user(servers, tmp_path):
    registry, _ = servers
    registry.routes = {"/v2/": (401, {"WWW-Authenticate": 'Basic realm="r"'}, b"")}
    with pytest.raises(ImportFailed) as refused:
        _pull(registry, tmp_path, BOB)
    assert str(refused.value).endswith(f"{_host(registry)} refused the login for user bob "
                                       "(HTTP 401)")
    assert "hunter2" not in str(refused.value)


def test_a_bearer_challenge_fetches_the_token_with_the_credentials(servers, tmp_path):
    """The realm is another host:port (docker's token flow); it gets Basic, the registry
    gets only the token."""
    registry, tokens = servers
    realm = f"http://{_host(tokens)}/token"
    challenge = f'Bearer realm="{realm}",service="reg",scope="repository:site/a:pull"'
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    registry.routes = {"/v2/site/a/manifests/": (0, {}, lambda auth: ok if auth == "Bearer T"
                                                 else (401, {"WWW-Authenticate": challenge},
                                                       b"")),
                       "/v2/site/a/blobs/": (200, {}, b"{}")}
    tokens.routes = {"/token": (0, {}, _needs(BOB.basic(), (200, {}, b'{"token": "T"}')))}
    _pull(registry, tmp_path, BOB)
    assert tokens.seen == [("/token?service=reg&scope=repository%3Asite%2Fa%3Apull",
                            BOB.basic())]
    assert {auth for _, auth in registry.seen} == {None, "Bearer T"}


def test_a_token_service_that_refuses_the_login_is_one_line(servers, tmp_path):
    registry, tokens = servers
    challenge = f'Bearer realm="http://{_host(tokens)}/token",service="reg"'
    registry.routes = {"/v2/": (401, {"WWW-Authenticate": challenge}, b"")}
    tokens.routes = {"/token": (401, {}, b'{"errors": []}')}
    with pytest.raises(ImportFailed, match=rf"{_host(registry)} \(its token service "
                                           rf"{_host(tokens)}\) refused the login for user "
                                           r"bob \(HTTP 401\)$"):
        _pull(registry, tmp_path, BOB)


def test_a_redirect_to_another_host_carries_no_credentials(servers, tmp_path):
    """Blob storage elsewhere (a redirect to another host:port) gets no Authorization."""
    registry, storage = servers
    config = json.loads(MANIFEST)["config"]["digest"]
    registry.routes = {
        "/v2/site/a/manifests/": (0, {}, _needs(BOB.basic(), (
            200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST))),
        "/v2/site/a/blobs/": (307, {"Location": f"http://{_host(storage)}/blob"}, b"")}
    storage.routes = {"/blob": (200, {}, b"{}")}
    _pull(registry, tmp_path, BOB)
    assert ("/v2/site/a/blobs/" + config, BOB.basic()) in registry.seen
    assert storage.seen == [("/blob", None)]


@pytest.mark.parametrize("credentials, refused", [(None, False), (BOB, True)])
def test_credentials_go_to_a_plain_http_realm_only_from_a_plain_http_registry(
        credentials, refused):
    """An HTTPS registry's realm on plain HTTP (loopback) may hand out anonymous tokens,
    but the login is not sent there in the clear."""
    client = Client(parse_reference("docker://registry.example.org/a:1"),
                    Access(credentials=credentials))
    realm = urllib.parse.urlsplit("http://127.0.0.1:1/token")
    if refused:
        with pytest.raises(ImportFailed, match="is plain HTTP while registry.example.org is "
                                               "HTTPS; the login is not sent there"):
            client._check_realm_scheme(realm)
    else:
        client._check_realm_scheme(realm)


def test_credentials_from_an_auth_file_are_used(servers, tmp_path):
    registry, _ = servers
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    registry.routes = {"/v2/site/a/manifests/": (0, {}, _needs(BOB.basic(), ok)),
                       "/v2/site/a/blobs/": (200, {}, b"{}")}
    path = _file(tmp_path, "auth.json", {"auths": {_host(registry): _auth("bob", "hunter2")}})
    reference = parse_reference(f"docker://{_host(registry)}/site/a:1")
    pull(reference, LayoutWriter(tmp_path / "layout"), Access(auth_files=(path,)))
    assert registry.seen[-1][1] == BOB.basic()


def test_an_expired_token_is_fetched_again_once(servers, tmp_path):
    """A bearer token that served the manifest and then expires (a long pull) is renewed;
    a token refused at once is not asked for again."""
    registry, tokens = servers
    challenge = f'Bearer realm="http://{_host(tokens)}/token",service="reg"'
    issued = iter(["T1", "T2"])
    tokens.routes = {"/token": (0, {}, lambda auth: (200, {}, json.dumps(
        {"token": next(issued, "T-more")}).encode()))}
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    refused = (401, {"WWW-Authenticate": challenge}, b"")
    registry.routes = {
        "/v2/site/a/manifests/": (0, {}, lambda auth: ok if auth == "Bearer T1" else refused),
        "/v2/site/a/blobs/": (0, {}, lambda auth: (200, {}, b"{}") if auth == "Bearer T2"
                              else refused)}
    _pull(registry, tmp_path / "renewed")
    assert len(tokens.seen) == 2 and registry.seen[-1][1] == "Bearer T2"
    issued = iter(["T0"])  # never taken: one new token, then one line
    tokens.seen.clear()
    with pytest.raises(ImportFailed, match="refused anonymous access to site/a"):
        _pull(registry, tmp_path / "refused")
    assert len(tokens.seen) == 1


def test_auth_files_are_not_read_when_the_registry_asks_for_no_login(servers, tmp_path):
    registry, _ = servers
    registry.routes = {"/v2/site/a/manifests/": (200, {
        "Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST),
        "/v2/site/a/blobs/": (200, {}, b"{}")}
    broken = tmp_path / "auth.json"
    broken.write_text("{")
    reference = parse_reference(f"docker://{_host(registry)}/site/a:1")
    pull(reference, LayoutWriter(tmp_path / "layout"), Access(auth_files=(broken,)))


def test_a_login_taken_but_denied_the_repository_is_one_line(servers, tmp_path):
    registry, _ = servers
    registry.routes = {"/v2/": (0, {}, _needs(BOB.basic(), (403, {}, b"")))}
    with pytest.raises(ImportFailed) as refused:
        _pull(registry, tmp_path, BOB)
    assert str(refused.value).endswith(f"{_host(registry)} refused user bob access to site/a "
                                       "(HTTP 403)")


def _server_tls(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA (its path) and a server context with the certificate it signs for 127.0.0.1
    (the integration tests' make_ca)."""
    from tests.integration.test_registry_auth import make_ca
    (folder / "tls").mkdir()
    ca, tls = make_ca(folder / "tls")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls["certificate"], tls["key"])
    return ca, context


@pytest.fixture
def tls_then_plain(tmp_path):
    """A loopback port whose first connection is TLS (a certificate from the test's CA)
    answering 401 Basic; the next hangs up in the handshake (a dropped connection); any
    later one is read as plain HTTP and recorded. Yields (host, CA path, plain requests)."""
    ca, context = _server_tls(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    plain, stop = [], threading.Event()

    def serve():
        number = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.settimeout(10)
            with contextlib.suppress(OSError), conn:
                if number == 0:
                    with context.wrap_socket(conn, server_side=True) as secure:
                        secure.recv(65536)
                        secure.sendall(b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic '
                                       b'realm="r"\r\nContent-Length: 0\r\n\r\n')
                elif number == 1:
                    conn.recv(65536)  # the ClientHello, unanswered
                else:
                    plain.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 500 x\r\nContent-Length: 0\r\n\r\n")
            number += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", ca, plain
    stop.set()
    thread.join(timeout=10)
    listener.close()


def test_a_loopback_registry_that_spoke_tls_is_never_asked_in_the_clear(tls_then_plain,
                                                                         tmp_path):
    """HTTPS first on loopback falls back to plain HTTP only before any HTTPS answer: a
    handshake that breaks after the 401 (the login now known) is one line, and the
    credentials never go out in the clear."""
    host, ca, plain = tls_then_plain
    with pytest.raises(ImportFailed, match=f"cannot reach {host}"):
        pull(parse_reference(f"docker://{host}/site/a:1"), LayoutWriter(tmp_path / "layout"),
             Access(credentials=BOB, ca_files=(ca,)))
    assert plain == []


def test_a_host_the_registry_redirected_to_cannot_ask_for_the_login(servers, tmp_path):
    """Blob storage elsewhere that answers 401 with a bearer realm of its own gets no
    token fetched with the credentials: one line naming it, not its signed URL."""
    registry, storage = servers
    registry.routes = {
        "/v2/site/a/manifests/": (0, {}, _needs(BOB.basic(), (
            200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST))),
        "/v2/site/a/blobs/": (307, {"Location": f"http://{_host(storage)}/blob?sig=s3cr3t"},
                              b"")}
    realm = f"http://{_host(storage)}/token"
    storage.routes = {"/token": (200, {}, b'{"token": "T"}'),
                      "/blob": (401, {"WWW-Authenticate": f'Bearer realm="{realm}"'}, b"")}
    with pytest.raises(ImportFailed) as refused:
        _pull(registry, tmp_path, BOB)
    assert [auth for _, auth in storage.seen] == [None]
    assert str(refused.value).endswith(f"{_host(storage)}, where {_host(registry)} "
                                       "redirected, answered HTTP 401")
    assert "s3cr3t" not in str(refused.value)


@pytest.mark.parametrize("answer, message", [
    (json.dumps({"token": "T\r\nX-Injected: 1"}).encode(), "not printable ASCII"),
    (json.dumps({"access_token": "two words"}).encode(), "not printable ASCII"),
    (json.dumps({"token": 7, "access_token": ""}).encode(), "sent no token"),
    (b"<html>not json</html>", "no token from"),
    (b'{"token": "' + b"x" * (5 << 20) + b'"}', "no token from"),  # cut at 4 MiB
    (b"[" * 100_000, "no token from .*maximum recursion depth"),
])
def test_a_token_answer_that_cannot_serve_is_one_line(servers, tmp_path, answer, message):
    registry, tokens = servers
    challenge = f'Bearer realm="http://{_host(tokens)}/token",service="reg"'
    registry.routes = {"/v2/": (401, {"WWW-Authenticate": challenge}, b"")}
    tokens.routes = {"/token": (200, {}, answer)}
    with pytest.raises(ImportFailed, match=message) as refused:
        _pull(registry, tmp_path, BOB)
    assert "\n" not in str(refused.value) and "hunter2" not in str(refused.value)


@pytest.mark.parametrize("headers, message", [
    ({"WWW-Authenticate": 'Bearer realm="https://[::1/token"'}, "token realm is not a URL"),
    ({"WWW-Authenticate": 'Bearer realm="file:///etc/passwd"'}, "token realm is not a URL"),
    ({"WWW-Authenticate": "Bearer service=reg"}, "token realm is not a URL"),
    ({"WWW-Authenticate": "Negotiate"}, "cannot give \\(negotiate\\)"),
    ({"WWW-Authenticate": 'Negotiate, Basic realm="x"'}, "refused the login for user bob"),
])
def test_an_odd_challenge_is_one_line(servers, tmp_path, headers, message):
    registry, _ = servers
    registry.routes = {"/v2/": (401, headers, b"")}
    with pytest.raises(ImportFailed, match=message):
        _pull(registry, tmp_path, BOB)


def test_a_redirect_to_a_url_that_does_not_parse_is_one_line(servers, tmp_path):
    registry, _ = servers
    registry.routes = {"/v2/": (307, {"Location": "http://[::1/blob"}, b"")}
    with pytest.raises(ImportFailed, match="cannot reach .*: Invalid IPv6 URL"):
        _pull(registry, tmp_path)


def test_challenges_on_several_header_lines_are_all_read(servers, tmp_path):
    """A proxy's Negotiate on the first WWW-Authenticate line, the registry's Basic on the
    second (the stub sends keys that differ in case as two lines): the login is given."""
    registry, _ = servers
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    two_lines = (401, {"WWW-Authenticate": "Negotiate", "www-authenticate": 'Basic realm="r"'},
                 b"")
    registry.routes = {"/v2/site/a/manifests/": (0, {}, lambda auth: ok if auth == BOB.basic()
                                                 else two_lines),
                       "/v2/site/a/blobs/": (200, {}, b"{}")}
    _pull(registry, tmp_path, BOB)
    assert registry.seen[-1][1] == BOB.basic()


@pytest.mark.parametrize("content, message", [
    (b"[" * 100_000, "its JSON nests too deep"),
    (json.dumps({"auths": {}, "pad": "x" * (2 << 20)}).encode(), "larger than 1 MiB"),
    (None, "not a regular file"),  # /dev/null, a character device
])
def test_auth_files_that_are_too_much_are_one_line(tmp_path, content, message):
    path = Path("/dev/null") if content is None else tmp_path / "auth.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidInput, match=f"auth file {path}: .*{message}"):
        find_credentials((path,), "reg.example", "a")


def test_an_auth_file_that_is_a_fifo_is_one_line_not_a_wait(tmp_path):
    """$REGISTRY_AUTH_FILE naming a FIFO: refused at once, not waiting for a writer."""
    path = tmp_path / "auth.json"
    os.mkfifo(path)
    outcome = []

    def read():
        try:
            find_credentials((path,), "reg.example", "a")
        except InvalidInput as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=30)
    if thread.is_alive():
        with open(path, "wb"):  # the writer it waits for: let the thread end
            pass
        thread.join(timeout=10)
    assert outcome == [f"auth file {path}: cannot read it as JSON: not a regular file"]


def test_a_manifest_nested_too_deep_is_one_line(servers, tmp_path):
    registry, _ = servers
    registry.routes = {"/v2/site/a/manifests/": (200, {
        "Content-Type": "application/vnd.oci.image.manifest.v1+json"}, b"[" * 100_000)}
    with pytest.raises(ImportFailed, match="the manifest is not JSON"):
        _pull(registry, tmp_path)


@pytest.fixture
def tls_registry(tmp_path):
    """A Recorder on loopback that speaks only TLS (a certificate from the test's CA);
    yields (server, CA path)."""
    ca, context = _server_tls(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.routes, server.seen = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, ca
    server.shutdown()
    server.server_close()


def test_insecure_still_tries_https_first(tls_registry, tmp_path):
    """--insecure allows plain HTTP to a registry that does not speak TLS; one that does
    is spoken to over TLS, so the login is not sent in the clear (plain HTTP first would
    have sent it to the same host's port 80 behind a redirect to HTTPS)."""
    registry, ca = tls_registry
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    registry.routes = {"/v2/site/a/manifests/": (0, {}, _needs(BOB.basic(), ok)),
                       "/v2/site/a/blobs/": (200, {}, b"{}")}
    reference = parse_reference(f"docker://{_host(registry)}/site/a:1")
    pull(reference, LayoutWriter(tmp_path / "layout"),
         Access(credentials=BOB, insecure=True, ca_files=(ca,)))
    assert registry.seen[-1][1] == BOB.basic()



@pytest.mark.parametrize("text", ["docker://bob:hunter2@reg.example/x:1",
                                  "docker://bob:hun/ter2@reg.example:5000/x@sha256:" + "a" * 64,
                                  "docker://bob:hunter2@reg.example/x"])
def test_a_login_in_the_reference_is_refused_without_echoing_it(text):
    """skopeo has no USER:PASSWORD@ in docker:// references; the bad-reference line
    echoed the text, so the password reached the terminal and any log of stderr."""
    with pytest.raises(InvalidInput) as refused:
        parse_reference(text)
    assert "hunter2" not in str(refused.value) and "ter2" not in str(refused.value)
    assert str(refused.value) == ("a docker:// reference has '@' only before a sha256 "
                                  "digest; a login (USER:PASSWORD@) is not read from it: give "
                                  "--creds USER or an auth file (--authfile)")


def test_a_digest_reference_is_not_a_login():
    digest = "sha256:" + "a" * 64
    assert parse_reference(f"docker://reg.example:5000/x@{digest}").ref == digest


@pytest.mark.parametrize("location, refusal", [
    # plain HTTP off loopback: refused before any connection, the line names the host only
    ("http://AKIA:s3cret@storage.invalid/b",
     r"redirected to plain HTTP \(storage.invalid\); use --insecure"),
    ("https://AKIA:s3cret@storage.invalid/b",
     r"redirected to a URL holding a USER:PASSWORD@ login \(storage.invalid\); not followed"),
])
def test_a_redirect_with_a_login_in_its_url_is_refused_unshown(tls_registry, tmp_path,
                                                               location, refusal):
    """Blob storage URLs may carry a login (USER:KEY@HOST): never followed nor shown."""
    registry, ca = tls_registry
    registry.routes = {"/v2/site/a/manifests/": (200, {
        "Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST),
        "/v2/site/a/blobs/": (307, {"Location": location}, b"")}
    reference = parse_reference(f"docker://{_host(registry)}/site/a:1")
    with pytest.raises(ImportFailed, match=refusal) as refused:
        pull(reference, LayoutWriter(tmp_path / "layout"), Access(ca_files=(ca,)))
    assert "s3cret" not in str(refused.value)


def test_a_token_realm_with_a_login_in_its_url_is_refused_unshown(servers, tmp_path):
    """urllib took `u:s3cret@127.0.0.1` for the host name (a DNS lookup of it) and the
    line showed it."""
    registry, _ = servers
    registry.routes = {"/v2/": (401, {"WWW-Authenticate": 'Bearer realm="https://u:s3cret@'
                                      '127.0.0.1:1/token"'}, b"")}
    with pytest.raises(ImportFailed, match=r"token realm https://127.0.0.1:1/token holds a "
                                           "USER:PASSWORD@ login; not used$") as refused:
        _pull(registry, tmp_path)
    assert "s3cret" not in str(refused.value)


def _bearer_to(realm: str) -> dict:
    """Routes of a registry that wants a bearer token from `realm` (any token will do)."""
    challenge = f'Bearer realm="{realm}",service="reg"'
    ok = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
    return {"/v2/site/a/manifests/": (0, {}, lambda auth: ok if auth == "Bearer T" else (
        401, {"WWW-Authenticate": challenge}, b"")), "/v2/site/a/blobs/": (200, {}, b"{}")}


@pytest.mark.parametrize("insecure", [False, True])
def test_an_https_registry_sends_no_login_to_a_plain_http_realm(tls_registry, servers,
                                                                tmp_path, insecure):
    """The registry over HTTPS, its token realm plain HTTP (on loopback, so even without
    --insecure it may hand out anonymous tokens): the login is refused in one line and
    the token service never sees it; anonymous pulls get their token."""
    registry, ca = tls_registry
    _, tokens = servers
    tokens.routes = {"/token": (200, {}, b'{"token": "T"}')}
    registry.routes = _bearer_to(f"http://{_host(tokens)}/token")
    reference = parse_reference(f"docker://{_host(registry)}/site/a:1")
    access = Access(credentials=BOB, insecure=insecure, ca_files=(ca,))
    with pytest.raises(ImportFailed, match=rf"the token realm http://{_host(tokens)}/token is "
                                           rf"plain HTTP while {_host(registry)} is HTTPS; "
                                           "the login is not sent there$"):
        pull(reference, LayoutWriter(tmp_path / "bob"), access)
    assert tokens.seen == []
    pull(reference, LayoutWriter(tmp_path / "anonymous"), Access(ca_files=(ca,)))
    assert tokens.seen == [("/token?service=reg", None)]


def test_an_https_realm_on_another_host_gets_the_login(tls_registry, tmp_path):
    """docker's token flow: the realm may be another host:port; over HTTPS (here the
    registry's certificate) it gets the login."""
    registry, ca = tls_registry
    tokens = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    tokens.socket = registry.socket.context.wrap_socket(tokens.socket, server_side=True)
    tokens.routes = {"/token": (0, {}, _needs(BOB.basic(), (200, {}, b'{"token": "T"}')))}
    tokens.seen = []
    threading.Thread(target=tokens.serve_forever, daemon=True).start()
    try:
        registry.routes = _bearer_to(f"https://{_host(tokens)}/token")
        reference = parse_reference(f"docker://{_host(registry)}/site/a:1")
        pull(reference, LayoutWriter(tmp_path / "layout"),
             Access(credentials=BOB, ca_files=(ca,)))
    finally:
        tokens.shutdown()
        tokens.server_close()
    assert tokens.seen == [("/token?service=reg", BOB.basic())]
    assert registry.seen[-1][1] == "Bearer T"


# The real CLI in a child process (what a user runs): bad input around the login is one line
# on stderr and a non-zero exit, never a traceback. The stub registry asks for Basic.

def _import(state_dir: Path, registry, *args, env: dict | None = None, stdin: bytes = b"",
            wrap: tuple[str, ...] = (), close_stdin: bool = False):
    environ = {k: v for k, v in os.environ.items() if k not in (
        "REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_CONFIG")}
    environ.update({"HOME": str(state_dir.parent / "home"), **(env or {})})
    argv = [*wrap, sys.executable, "-m", "provisiond", "--state-dir", str(state_dir), "image",
            "import", f"docker://{_host(registry)}/site/a:1", "a", *args]
    return subprocess.run([a for a in argv if a is not None],
                          input=None if close_stdin else stdin, capture_output=True,
                          env={k: v for k, v in environ.items() if v is not None},
                          timeout=120, preexec_fn=(lambda: os.close(0)) if close_stdin else None)


def _one_line(proc, code: int, part: str) -> bool:
    err = proc.stderr.decode(errors="replace")
    return proc.returncode == code and err.count("\n") == 1 and "Traceback" not in err \
        and part in err


@pytest.fixture
def basic_registry(servers):
    registry, _ = servers
    registry.routes = {"/v2/": (401, {"WWW-Authenticate": 'Basic realm="r"'}, b"")}
    return registry


def test_no_home_directory_is_one_line(basic_registry, state_dir):
    """No $HOME and a user ID without a passwd entry (unshare maps us to 54321, keeping the
    capabilities an import needs): Path.home() raised RuntimeError."""
    unshare = tool("unshare")
    wrap = (unshare, "--map-user=54321", "--map-group=54321", "--keep-caps", "--user")
    proc = _import(state_dir, basic_registry, env={"HOME": None}, wrap=wrap)
    assert _one_line(proc, ExitCode.BUILD_FAILED, "asks for a login; give --creds USER or an "
                     "auth file with an entry for it (--authfile) (no home directory ($HOME "
                     "is unset and user ID 54321 has no passwd entry)"), proc.stderr


@pytest.mark.parametrize("stdin, close, errors, message", [
    (b"", True, "strict", "password of bob: read an empty value from stdin"),
    (b"", False, "strict", "password of bob: read an empty value from stdin"),
    # stdin decoded strictly (UnicodeDecodeError), or keeping bytes as surrogates (what
    # Python does in the C and C.UTF-8 locales: the CLI's read_secret refuses both)
    (b"\xff\xfe\n", False, "strict", "password of bob: standard input is not valid UTF-8"),
    (b"\xff\xfe\n", False, "surrogateescape",
     "password of bob: standard input is not valid UTF-8"),
])
def test_a_password_stdin_that_cannot_serve_is_one_line(basic_registry, state_dir, stdin,
                                                        close, errors, message):
    proc = _import(state_dir, basic_registry, "--creds", "bob", "--password-stdin",
                   env={"PYTHONIOENCODING": f"utf-8:{errors}"}, stdin=stdin,
                   close_stdin=close)
    assert _one_line(proc, ExitCode.INVALID_INPUT, message), proc.stderr


def test_creds_that_are_not_utf8_are_one_line(basic_registry, state_dir):
    proc = _import(state_dir, basic_registry, b"--creds", b"bob:\xff")
    assert _one_line(proc, ExitCode.INVALID_INPUT, "the password of the registry login for "
                     "bob is not valid UTF-8"), proc.stderr


@pytest.mark.parametrize("content, message", [
    (None, "cannot read it as JSON: Is a directory"),  # a folder where the file should be
    ("{", "cannot read it as JSON"),
    ('{"auths": {"HOST": {"auth": "bm90OmJhc2U2NA=="}}, "x": ', "cannot read it as JSON"),
    ("\xff{", "cannot read it as JSON"),
    ('["auths"]', "not a JSON object"),
    ('{"auths": {"HOST": []}}', "the entry for HOST is not an object"),
    ('{"auths": {"HOST": {"auth": "!not base64"}}}', 'the "auth" of HOST is not base64'),
    ('{"auths": {"HOST": {"auth": 7}}}', 'the "auth" of HOST is not base64'),
    ('{"auths": {"HOST": {"auth": "/w=="}}}', 'the "auth" of HOST is not base64'),
])
@pytest.mark.parametrize("how", ["--authfile", "REGISTRY_AUTH_FILE", "~/.docker"])
def test_auth_files_that_cannot_serve_are_one_line_from_the_cli(basic_registry, state_dir,
                                                                content, message, how):
    home = state_dir.parent / "home"
    path = home / ".docker/config.json"
    path.parent.mkdir(parents=True)
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content.replace("HOST", _host(basic_registry)).encode(
            "latin-1" if content.startswith("\xff") else "utf-8"))
    args, env = {"--authfile": ((f"--authfile={path}",), {}),
                 "REGISTRY_AUTH_FILE": ((), {"REGISTRY_AUTH_FILE": str(path)}),
                 "~/.docker": ((), {})}[how]
    proc = _import(state_dir, basic_registry, *args, env=env)
    expected = message.replace("HOST", _host(basic_registry))
    if how == "--authfile" and content is None:
        expected = "no such file (a directory)"
    else:
        assert str(path) in proc.stderr.decode()
    assert _one_line(proc, ExitCode.INVALID_INPUT, expected), proc.stderr


def test_an_unreadable_auth_file_is_one_line(basic_registry, state_dir):
    """EACCES even for root: in a user namespace (unshare maps us to 54321) the file belongs
    to an unmapped user (12345) and is 0600."""
    path = state_dir.parent / "auth.json"
    path.write_text("{}")
    path.chmod(0o600)
    os.chown(path, 12345, 12345)
    wrap = (tool("unshare"), "--map-user=54321", "--map-group=54321", "--keep-caps", "--user")
    proc = _import(state_dir, basic_registry, "--authfile", str(path), wrap=wrap)
    assert _one_line(proc, ExitCode.INVALID_INPUT, f"auth file {path}: cannot read it as "
                     "JSON: Permission denied"), proc.stderr
