"""The registry client's own rules: references, when plain HTTP is allowed, and what it
refuses from a registry that misbehaves (a stub on loopback plays one: the real registry
never serves a manifest past its own 4 MiB limit)."""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import ssl
import threading
import urllib.error
from types import SimpleNamespace

import pytest

from provisiond.errors import InvalidInput, NotFound
from provisiond.images.layout import ImportFailed, LayoutWriter, pick_platform
from provisiond.images.registry import Client, parse_reference, pull
from provisiond.images.registry_access import Access


@pytest.mark.parametrize("text, registry, repository, ref", [
    ("docker://127.0.0.1:5000/site/tiny:v1", "127.0.0.1:5000", "site/tiny", "v1"),
    ("docker://localhost/tiny", "localhost", "tiny", "latest"),
    ("docker://registry.example.org/a/b/c@sha256:" + "a" * 64, "registry.example.org",
     "a/b/c", "sha256:" + "a" * 64),
    ("docker://debian:12", "registry-1.docker.io", "library/debian", "12"),
    ("docker://[::1]:5000/x:y", "[::1]:5000", "x", "y"),
])
def test_references(text, registry, repository, ref):
    parsed = parse_reference(text)
    assert (parsed.registry, parsed.repository, parsed.ref) == (registry, repository, ref)


@pytest.mark.parametrize("text", ["oci:/x", "docker://", "docker://h.org/UPPER:v1",
                                  "docker://h.org/x:bad!tag", "docker://h.org/x@sha256:12",
                                  "docker://h.org/x:" + "t" * 200, "docker://h.org/../x",
                                  "docker://127.0.0.1:99999/x:1", "docker://h.org:0/x:1"])
def test_bad_references_are_invalid_input(text):
    with pytest.raises(InvalidInput, match="not a registry reference"):
        parse_reference(text)


@pytest.mark.parametrize("text, insecure, scheme, fallback", [
    ("docker://registry.example.org/x:1", False, "https", False),
    ("docker://registry.example.org/x:1", True, "https", True),
    ("docker://10.0.0.5:5000/x:1", False, "https", False),
    ("docker://127.0.0.1:5000/x:1", False, "https", True),
    ("docker://[::1]:5000/x:1", False, "https", True),
    ("docker://localhost:5000/x:1", False, "https", True),
])
def test_plain_http_only_for_loopback_or_insecure(text, insecure, scheme, fallback):
    """HTTPS first on loopback and with --insecure, plain HTTP if the registry does not
    speak TLS."""
    client = Client(parse_reference(text), Access(insecure=insecure))
    assert (client.scheme, client.may_fall_back) == (scheme, fallback)


def test_an_index_without_linux_amd64_names_what_it_has():
    index = {"manifests": [{"digest": "sha256:" + "1" * 64,
                            "platform": {"os": "linux", "architecture": "arm64"}},
                           {"digest": "sha256:" + "2" * 64,
                            "platform": {"os": "windows", "architecture": "amd64"}}]}
    with pytest.raises(ImportFailed, match=r"no linux/amd64 image \(the index has "
                                           r"linux/arm64, windows/amd64\)"):
        pick_platform(index, "x")


class Misbehaving(http.server.BaseHTTPRequestHandler):
    """Answers every GET with `self.server.answer` (status, headers, body)."""

    def do_GET(self):
        status, headers, body = self.server.answer
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the client hanging up on an oversize body is the point


@pytest.fixture
def stub():
    server = QuietServer(("127.0.0.1", 0), Misbehaving)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _pull(server, tmp_path):
    reference = parse_reference(f"docker://127.0.0.1:{server.server_address[1]}/x:1")
    return pull(reference, LayoutWriter(tmp_path / "layout"))


@pytest.mark.parametrize("length", [True, False])
def test_an_oversize_manifest_is_refused(stub, tmp_path, length):
    """With a Content-Length past the limit (refused unread) or without one (read to the
    limit and no further)."""
    body = b'{"schemaVersion": 2, "pad": "' + b"x" * (5 << 20) + b'"}'
    headers = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
    if length:
        headers["Content-Length"] = str(len(body))
    stub.answer = (200, headers, body)
    with pytest.raises(ImportFailed, match="the manifest is larger than 4 MiB"):
        _pull(stub, tmp_path)


def test_a_basic_challenge_without_credentials_asks_for_them(stub, tmp_path):
    stub.answer = (401, {"WWW-Authenticate": 'Basic realm="registry"', "Content-Length": "0"},
                   b"")
    with pytest.raises(ImportFailed, match=r"127\.0\.0\.1:\d+ asks for a login; give --creds "
                                           r"USER or an auth file"):
        _pull(stub, tmp_path)


def test_a_plain_http_token_realm_elsewhere_is_refused(stub, tmp_path):
    challenge = 'Bearer realm="http://auth.example.org/token",service="s",scope="x"'
    stub.answer = (401, {"WWW-Authenticate": challenge, "Content-Length": "0"}, b"")
    with pytest.raises(ImportFailed, match="token realm http://auth.example.org/token is "
                                           r"plain HTTP \(use --insecure"):
        _pull(stub, tmp_path)


def test_a_manifest_whose_digest_header_lies_is_refused(stub, tmp_path):
    body = b'{"schemaVersion": 2}'
    stub.answer = (200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json",
                         "Docker-Content-Digest": "sha256:" + "0" * 64,
                         "Content-Length": str(len(body))}, body)
    with pytest.raises(ImportFailed, match="digest mismatch: expected sha256:0000"):
        _pull(stub, tmp_path)


def test_a_redirect_to_plain_http_elsewhere_is_refused(stub, tmp_path):
    """0.0.0.0 is not a loopback address (and, were it followed, reaches only this host)."""
    stub.answer = (307, {"Location": "http://0.0.0.0:9/x", "Content-Length": "0"}, b"")
    with pytest.raises(ImportFailed, match=r"redirected to plain HTTP \(0.0.0.0:9\)"):
        _pull(stub, tmp_path)


@pytest.fixture
def raw():
    """A loopback server that answers each connection with `raw.answer(request line)` and
    hangs up: what a port that is not a registry, or a registry cut off mid-answer, sends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    server = SimpleNamespace(port=listener.getsockname()[1], answer=None, stop=False)

    def serve():
        while not server.stop:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                # a TLS ClientHello first (the client tries HTTPS on loopback first)
                line = conn.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace")
                conn.sendall(server.answer(line))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server
    server.stop = True
    thread.join(timeout=10)
    listener.close()


def _raw_pull(server, tmp_path):
    reference = parse_reference(f"docker://127.0.0.1:{server.port}/x:1")
    return pull(reference, LayoutWriter(tmp_path / "layout"))


def test_a_port_that_does_not_speak_http_is_one_error(raw, tmp_path):
    raw.answer = lambda line: b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"
    with pytest.raises(ImportFailed, match=r"cannot reach 127\.0\.0\.1:\d+: BadStatusLine"):
        _raw_pull(raw, tmp_path)


def _manifest() -> bytes:
    config, layer = b"{" + b" " * 600 + b"}", b"layer"  # past the cut-off chunk
    return json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 602,
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": 5,
                    "digest": "sha256:" + hashlib.sha256(layer).hexdigest()}]}).encode()


@pytest.mark.parametrize("cut", ["manifests", "blobs"])
def test_an_answer_cut_off_mid_chunk_is_one_error_and_leaves_no_partial(raw, tmp_path, cut):
    def answer(line: str) -> bytes:
        if f"/{cut}/" in line:
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n{\"sch"
        body = _manifest()
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1"
                b"+json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    raw.answer = answer
    with pytest.raises(ImportFailed, match=r"x:1: .*broke off: IncompleteRead"):
        _raw_pull(raw, tmp_path)
    assert list((tmp_path / "layout/blobs/sha256").iterdir()) == []


def test_a_kept_blob_of_the_right_size_but_other_bytes_is_not_reused(tmp_path):
    """Blobs an earlier import holds are reused, but a folder imported by path was copied
    unchecked: a file named for a digest, of its size, need not hold its bytes."""
    genuine, other = b"genuine layer", b"planted layer"
    kept = tmp_path / "kept"
    kept.write_bytes(other)
    descriptor = {"digest": "sha256:" + hashlib.sha256(genuine).hexdigest(),
                  "size": len(genuine)}
    writer = LayoutWriter(tmp_path / "layout", lambda digest: kept)
    assert not writer.has(descriptor)
    assert not writer.path(descriptor["digest"]).exists()
    kept.write_bytes(genuine)
    assert writer.has(descriptor)
    assert writer.path(descriptor["digest"]).read_bytes() == genuine


@pytest.mark.parametrize("platform", ["linux/amd64", ["linux", "amd64"], 7])
def test_an_index_entry_whose_platform_is_not_an_object_is_refused(platform):
    index = {"manifests": [{"digest": "sha256:" + "1" * 64, "platform": platform}]}
    with pytest.raises(ImportFailed, match="no linux/amd64 image"):
        pick_platform(index, "x")


def test_an_index_entry_that_is_not_an_object_is_not_picked():
    with pytest.raises(ImportFailed, match="the index lists no manifests"):
        pick_platform({"manifests": ["sha256:" + "1" * 64]}, "x")


def test_a_layer_media_type_that_is_not_a_string_is_refused():
    from provisiond.images.layout import check_manifest

    doc = {"schemaVersion": 2, "config": {"digest": "sha256:" + "1" * 64, "size": 2},
           "layers": [{"mediaType": ["tar"], "digest": "sha256:" + "2" * 64, "size": 1}]}
    with pytest.raises(ImportFailed, match=r"layer media type \['tar'\] cannot be unpacked"):
        check_manifest(doc, "application/vnd.oci.image.manifest.v1+json", "x")


@pytest.mark.parametrize("index", [{"manifests": 5}, {"manifests": [
    {"digest": "sha256:" + "1" * 64, "annotations": ["org.opencontainers.image.ref.name"]}]}])
def test_an_oci_layout_index_of_the_wrong_shape_is_one_error(tmp_path, index):
    from provisiond.images.layout import copy_layout

    (tmp_path / "src").mkdir()
    (tmp_path / "src/index.json").write_text(json.dumps(index))
    with pytest.raises((ImportFailed, NotFound)):
        copy_layout(f"{tmp_path / 'src'}:v1", LayoutWriter(tmp_path / "layout"))


def test_a_token_realm_that_does_not_speak_http_is_one_error(raw, tmp_path):
    def answer(line: str) -> bytes:
        if "/token" in line:
            return b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"
        challenge = f'Bearer realm="http://127.0.0.1:{raw.port}/token",service="s"'
        return (b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: %s\r\n"
                b"Content-Length: 0\r\n\r\n" % challenge.encode())

    raw.answer = answer
    with pytest.raises(ImportFailed, match=r"no token from http://127\.0\.0\.1:\d+/token: "
                                           "BadStatusLine"):
        _raw_pull(raw, tmp_path)


@pytest.mark.parametrize("text, insecure, reason, falls_back", [
    ("docker://reg.example.org/x:1", True, ConnectionRefusedError(), True),  # 443, then 80
    ("docker://reg.example.org:5000/x:1", True, ConnectionRefusedError(), False),
    ("docker://reg.example.org/x:1", False, ConnectionRefusedError(), False),
    ("docker://reg.example.org:5000/x:1", True, ssl.SSLError("wrong version number"), True),
    ("docker://127.0.0.1:5000/x:1", False, ssl.SSLCertVerificationError("untrusted"), False),
])
def test_when_https_gives_way_to_plain_http(text, insecure, reason, falls_back):
    client = Client(parse_reference(text), Access(insecure=insecure))
    assert client._fall_back_to_http(urllib.error.URLError(reason)) is falls_back
    assert client.scheme == ("http" if falls_back else "https")
