"""`image import docker://...` against a real OCI distribution registry (Debian's
docker-registry on 127.0.0.1), holding images the test makes as OCI layouts and pushes
with Debian's skopeo; and `image import oci:DIR[:TAG]` from such a layout."""

from __future__ import annotations

import base64
import contextlib
import datetime
import gzip
import hashlib
import http.server
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
import zstandard
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from provisiond.errors import BuildFailed, InvalidInput, NotFound
from provisiond.images import blob_path, load_manifest
from tests.integration.boot.servers import free_port
from tests.integration.test_images_oci import BOTTOM, KERNEL, LAST, TOP, layer_tar, tree, \
    unpack_image
from tests.tools import tool
from tests.waits import wait_until

pytestmark = pytest.mark.skipif(not (tool("docker-registry") and tool("skopeo")),
                                reason="docker-registry or skopeo is not installed")
TAR = "application/vnd.oci.image.layer.v1.tar"
COMPRESS = {"gzip": (lambda data: gzip.compress(data, mtime=0), TAR + "+gzip"),
            "zstd": (lambda data: zstandard.ZstdCompressor().compress(data), TAR + "+zstd"),
            "none": (lambda data: data, TAR)}


class Layout:
    """An OCI layout folder the test writes images into (what skopeo pushes from)."""

    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "blobs/sha256").mkdir(parents=True)
        (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.entries: list[dict] = []

    def put(self, data: bytes, media: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (self.folder / "blobs/sha256" / digest[7:]).write_bytes(data)
        return {"mediaType": media, "digest": digest, "size": len(data)}

    def image(self, layers: list[tuple[str, bytes]], arch: str = "amd64") -> dict:
        """An image manifest of (compression, layer tar) pairs; returns its descriptor."""
        descriptors = []
        for how, data in layers:
            pack, media = COMPRESS[how]
            descriptors.append(self.put(pack(data), media))
        config = self.put(json.dumps({"architecture": arch, "os": "linux", "rootfs": {
            "type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(data).hexdigest()
                                           for _, data in layers]}}).encode(),
            "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config, "layers": descriptors}
        entry = self.put(json.dumps(manifest).encode(), manifest["mediaType"])
        return {**entry, "platform": {"os": "linux", "architecture": arch}}

    def tag(self, tag: str, entry: dict) -> None:
        self.entries.append({**entry, "annotations": {"org.opencontainers.image.ref.name": tag}})
        (self.folder / "index.json").write_text(json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": self.entries}))

    def index(self, entries: list[dict]) -> dict:
        """A multi-platform index of images; returns its descriptor."""
        doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
               "manifests": entries}
        return self.put(json.dumps(doc).encode(), doc["mediaType"])


@contextlib.contextmanager
def running_registry(folder: Path, auth: dict | None = None, tls: dict | None = None):
    """docker-registry on 127.0.0.1, plain HTTP unless `tls` ({"certificate": PEM path,
    "key": PEM path}); yields (host:port, storage dir)."""
    port = free_port()
    config = {"version": 0.1, "log": {"level": "error"},
              "storage": {"filesystem": {"rootdirectory": str(folder / "data")},
                          "delete": {"enabled": True}},
              "http": {"addr": f"127.0.0.1:{port}", "secret": "test-only",
                       **({"tls": tls} if tls else {})}}
    if auth:
        config["auth"] = auth
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    log = open(folder / "registry.log", "wb")
    proc = subprocess.Popen([tool("docker-registry"), "serve", str(folder / "config.yml")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/v2/") or proc.poll() is not None,
                   30, "docker-registry answers /v2/")
        assert proc.poll() is None, (folder / "registry.log").read_text()
        yield f"127.0.0.1:{port}", folder / "data"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as answer:
        yield answer


def _answers(url: str) -> bool:
    """Whether anything answers HTTP there (401 too: a registry asking for a token; 400
    too: a TLS registry asked in plain HTTP)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def push(layout: Layout, tag: str, dest: str, *flags: str) -> None:
    """skopeo copy oci:LAYOUT:TAG docker://DEST (plain HTTP to the loopback registry), the
    layers as they are unless `flags` convert them (skopeo would gzip an uncompressed one)."""
    flags = flags or ("--preserve-digests",)
    proc = subprocess.run([tool("skopeo"), "--insecure-policy", "copy", "--quiet",
                           "--dest-tls-verify=false", *flags, f"oci:{layout.folder}:{tag}",
                           f"docker://{dest}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout(tmp_path / "layout")


def three_layers(mark: str = "") -> list[tuple[str, bytes]]:
    """gzip, plain and zstd layers; `mark` makes their blobs this test's own (the registry
    keeps one copy of a blob for every repository: a test that damages one hurts the rest)."""
    marked = [{**layer, "etc/mark": mark.encode()} if mark else layer
              for layer in (BOTTOM, TOP, LAST)]
    return [(how, layer_tar(layer)) for how, layer in zip(("gzip", "none", "zstd"), marked)]


EXPECTED = {"boot": None, "data": None, "data/x": None, "data/x/3": b"3\n", "etc": None,
            "etc/a": b"a again\n", "etc/b": b"b\n", "etc/c": b"c\n", "sbin": None,
            "sbin/init": b"#!/bin/sh\n"}


def test_import_from_a_registry_makes_one_layer_per_registry_layer(
        cli, config, registry, layout, tmp_path):
    host, _ = registry
    entry = layout.image(three_layers())
    layout.tag("v1", entry)
    push(layout, "v1", f"{host}/site/tiny:v1")
    pushed = json.loads(_stored_blob(registry[1], entry["digest"]).read_bytes())
    assert [l["mediaType"].rsplit(".", 1)[1] for l in pushed["layers"]] == [
        "tar+gzip", "tar", "tar+zstd"]
    result = cli("image", "import", f"docker://{host}/site/tiny:v1", "fromreg",
                 "--kernel-arg", "quiet")
    assert result.code == 0, result.err
    manifest = load_manifest(config, "fromreg")
    assert len(manifest["layers"]) == 3
    assert manifest["kernel"]["version"] == "0.0-test" and manifest["kernel_args"] == ["quiet"]
    assert blob_path(config, manifest["kernel"]["digest"]).read_bytes() == KERNEL
    listed = unpack_image(config, manifest, tmp_path / "root")
    assert listed == ["/data/x/1", "/data/x/2"]
    assert tree(tmp_path / "root") == EXPECTED
    assert "fetched" in result.err and "present" not in result.err


def test_reimport_fetches_nothing_and_rebuilds_no_layer(cli, config, registry, layout):
    host, _ = registry
    layout.tag("v1", layout.image(three_layers()))
    push(layout, "v1", f"{host}/site/again:v1")
    assert cli("image", "import", f"docker://{host}/site/again:v1", "again").code == 0
    first = load_manifest(config, "again")
    result = cli("image", "import", f"docker://{host}/site/again:v1", "again", "--update")
    assert result.code == 0, result.err
    assert result.err.count("present") == 4 and "fetched" not in result.err, result.err
    assert result.err.count("cached") == 3 and "built" not in result.err, result.err
    assert load_manifest(config, "again")["layers"] == first["layers"]


def test_an_index_gives_its_linux_amd64_image(cli, config, registry, layout, tmp_path):
    host, _ = registry
    arm = layout.image([("gzip", layer_tar({**BOTTOM, "etc/arch": b"arm64\n"}))], "arm64")
    amd = layout.image([("gzip", layer_tar({**BOTTOM, "etc/arch": b"amd64\n"}))])
    layout.tag("multi", layout.index([arm, amd]))
    push(layout, "multi", f"{host}/site/multi:1", "--all", "--preserve-digests")
    result = cli("image", "import", f"docker://{host}/site/multi:1", "multi")
    assert result.code == 0, result.err
    unpack_image(config, load_manifest(config, "multi"), tmp_path / "root")
    assert (tmp_path / "root/etc/arch").read_bytes() == b"amd64\n"


def test_a_docker_v2_manifest_and_a_digest_reference(cli, config, registry, layout, tmp_path):
    host, _ = registry
    layout.tag("v1", layout.image([("gzip", layer_tar(BOTTOM)), ("gzip", layer_tar(TOP))]))
    push(layout, "v1", f"{host}/site/docker:v2s2", "--format", "v2s2")
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{host}/v2/site/docker/manifests/v2s2", headers={"Accept": (
                "application/vnd.docker.distribution.manifest.v2+json")})) as response:
        assert response.headers["Content-Type"] == (
            "application/vnd.docker.distribution.manifest.v2+json")
        digest = response.headers["Docker-Content-Digest"]
    result = cli("image", "import", f"docker://{host}/site/docker@{digest}", "docker")
    assert result.code == 0, result.err
    assert unpack_image(config, load_manifest(config, "docker"), tmp_path / "root") == [
        "/data/x/1", "/data/x/2", "/etc/a"]


def test_oci_layout_by_tag(cli, config, layout, tmp_path):
    layout.tag("one", layout.image([("gzip", layer_tar({**BOTTOM, "etc/which": b"one\n"}))]))
    layout.tag("two", layout.image([("zstd", layer_tar({**BOTTOM, "etc/which": b"two\n"}))]))
    result = cli("image", "import", f"oci:{layout.folder}:two", "fromdir")
    assert result.code == 0, result.err
    unpack_image(config, load_manifest(config, "fromdir"), tmp_path / "root")
    assert (tmp_path / "root/etc/which").read_bytes() == b"two\n"
    result = cli("image", "import", f"oci:{layout.folder}:three", "fromdir", "--force")
    assert result.code == NotFound.exit_code and result.err.count("\n") == 1, result.err
    assert "the layout has no image tagged 'three'" in result.err


def nothing_stored(config, name: str) -> bool:
    recipes = config.state_dir / "recipes"
    left = sorted(p.name for p in recipes.iterdir()) if recipes.is_dir() else []
    return left == [] and not (config.images_dir / name).exists()


@pytest.mark.parametrize("ref, code, message", [
    ("docker://HOST/Site/UPPER:v1", InvalidInput.exit_code, "not a registry reference"),
    ("docker://HOST/site/tiny:v1!", InvalidInput.exit_code, "not a registry reference"),
    ("docker://HOST/site/tiny:nope", NotFound.exit_code, "the registry has no such manifest"),
    ("docker://HOST/site/none:v1", NotFound.exit_code, "the registry has no such manifest"),
    ("docker://127.0.0.1:1/site/tiny:v1", BuildFailed.exit_code, "cannot reach 127.0.0.1:1"),
])
def test_bad_references_fail_in_one_line_and_store_nothing(cli, config, registry, layout,
                                                          ref, code, message):
    host, _ = registry
    layout.tag("v1", layout.image(three_layers()))
    push(layout, "v1", f"{host}/site/tiny:v1")
    result = cli("image", "import", ref.replace("HOST", host), "bad")
    assert result.code == code and result.err.count("\n") == 1, result.err
    assert message in result.err and "Traceback" not in result.err
    assert nothing_stored(config, "bad")


def _stored_blob(storage: Path, digest: str) -> Path:
    hexdigest = digest.split(":")[1]
    return storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


def test_a_layer_that_does_not_match_its_digest_is_refused(cli, config, registry, layout):
    host, storage = registry
    entry = layout.image(three_layers("corrupt"))
    layout.tag("v1", entry)
    push(layout, "v1", f"{host}/site/corrupt:v1")
    manifest = json.loads((layout.folder / "blobs/sha256" / entry["digest"][7:]).read_bytes())
    layer = _stored_blob(storage, manifest["layers"][1]["digest"])
    data = bytearray(layer.read_bytes())
    data[600] ^= 0xFF  # same size, other bytes
    layer.write_bytes(bytes(data))
    result = cli("image", "import", f"docker://{host}/site/corrupt:v1", "corrupt")
    assert result.code == BuildFailed.exit_code and "Traceback" not in result.err, result.err
    last = result.err.splitlines()[-1]
    assert f"blob {manifest['layers'][1]['digest']} does not match its digest" in last
    assert nothing_stored(config, "corrupt")


def test_a_failed_reimport_keeps_the_image_as_it_was(cli, config, registry, layout):
    host, _ = registry
    layout.tag("v1", layout.image(three_layers()))
    push(layout, "v1", f"{host}/site/kept:v1")
    assert cli("image", "import", f"docker://{host}/site/kept:v1", "kept").code == 0
    before = load_manifest(config, "kept")
    recipe = (config.state_dir / "recipes/kept/image.yaml").read_text()
    result = cli("image", "import", f"docker://{host}/site/kept:gone", "kept", "--force")
    assert result.code == NotFound.exit_code, result.err
    assert load_manifest(config, "kept") == before
    assert (config.state_dir / "recipes/kept/image.yaml").read_text() == recipe
    assert sorted(p.name for p in (config.state_dir / "recipes").iterdir()) == ["kept"]
    assert cli("image", "build", "kept").code == 0


class TokenService:
    """The registry's token realm: hands anyone (or, given `login`, only the Basic
    Authorization it names) a JWT granting the scope asked for, signed with a key whose
    self-signed certificate the registry trusts (its rootcertbundle)."""

    def __init__(self, folder: Path, login: str | None = None):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "provisiond test tokens")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(1)
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.bundle = folder / "tokens.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.scopes: list[str] = []
        self.logins: list[str | None] = []
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                service.logins.append(self.headers.get("Authorization"))
                if login and self.headers.get("Authorization") != login:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                service.scopes.extend(query.get("scope", []))
                body = json.dumps({"token": service.token(query.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def token(self, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": "provisiond-test", "sub": "", "aud": "registry-test", "exp": now + 300,
                  "nbf": now - 60, "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signed = ".".join(_b64(json.dumps(part).encode()) for part in (header, claims))
        signature = self.key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_b64(signature)}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@contextlib.contextmanager
def token_registry_running(folder: Path, login: str | None = None):
    """docker-registry asking for bearer tokens from a token service of the test's (which
    wants `login`, a Basic credential, if given): (host, tokens)."""
    tokens = TokenService(folder, login=login)
    auth = {"token": {"realm": tokens.realm, "service": "registry-test",
                      "issuer": "provisiond-test", "rootcertbundle": str(tokens.bundle)}}
    try:
        with running_registry(folder, auth) as (host, _):
            yield host, tokens
    finally:
        tokens.close()


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    """docker-registry asking for bearer tokens from a token service of the test's."""
    with token_registry_running(tmp_path_factory.mktemp("token-registry")) as running:
        yield running


def test_a_registry_that_asks_for_a_token_gets_one(cli, config, token_registry, layout,
                                                   tmp_path):
    host, tokens = token_registry
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{host}/v2/site/tok/manifests/v1")
    assert refused.value.code == 401 and "Bearer" in refused.value.headers["WWW-Authenticate"]
    layout.tag("v1", layout.image(three_layers("token")))
    push(layout, "v1", f"{host}/site/tok:v1")
    tokens.scopes.clear()
    result = cli("image", "import", f"docker://{host}/site/tok:v1", "tok")
    assert result.code == 0, result.err
    assert tokens.scopes == ["repository:site/tok:pull"]
    unpack_image(config, load_manifest(config, "tok"), tmp_path / "root")
    assert (tmp_path / "root/etc/mark").read_bytes() == b"token"


@pytest.mark.lab
@pytest.mark.slow
def test_an_image_pushed_to_the_registry_and_imported_boots(registry, tmp_path, monkeypatch):
    """The round trip: tiny's built layers as OCI layers, pushed with skopeo, imported from
    the registry into another state dir, and that import's kernel and layers boot under
    QEMU (TCG) to tiny's rcS marker, as tests/integration/test_images_boot.py boots tiny."""
    from provisiond.cli import main
    from provisiond.config import load_config, write_default_config
    from provisiond.images import build_image
    from provisiond.images.layers import layer_dir
    from provisiond.images.shell import write_layer
    from tests.integration.test_images_boot import boot_to_marker

    monkeypatch.setenv("PROVISIOND_CACHE_DIR",
                       os.environ.get("PROVISIOND_CACHE_DIR", "/var/tmp/provisiond-test-cache"))
    write_default_config(tmp_path / "builder")
    builder = load_config(tmp_path / "builder")
    tiny = build_image(builder, "tiny")
    layers = []
    for layer in tiny["layers"]:
        with open(tmp_path / "layer.tar", "wb") as out:
            write_layer(layer_dir(builder) / layer["key"], out)
        layers.append(("gzip", (tmp_path / "layer.tar").read_bytes()))
    layout = Layout(tmp_path / "layout")
    layout.tag("v1", layout.image(layers))
    push(layout, "v1", f"{registry[0]}/site/tiny-boot:v1")
    write_default_config(tmp_path / "state")
    config = load_config(tmp_path / "state")
    args = [a for arg in tiny["kernel_args"] for a in ("--kernel-arg", arg)]
    assert main(["--state-dir", str(config.state_dir), "image", "import",
                 f"docker://{registry[0]}/site/tiny-boot:v1", "tiny-boot", *args]) == 0
    manifest = load_manifest(config, "tiny-boot")
    assert len(manifest["layers"]) == len(tiny["layers"])
    assert manifest["kernel"]["digest"] == tiny["kernel"]["digest"]
    boot_to_marker(config, manifest, tmp_path, 180)


def test_two_imports_of_one_name_at_once_both_succeed(config, registry, layout):
    """A second import of a name while the first is fetching: both staged into one
    folder, and the second's clean-up of a 'stale' staging folder took the first's."""
    from provisiond.images import OverExisting, import_image

    host, _ = registry
    layout.tag("v1", layout.image(three_layers("twice")))
    push(layout, "v1", f"{host}/site/twice:v1")
    results: dict[str, object] = {}
    second_done = threading.Event()

    def second():
        try:
            results["second"] = import_image(config, f"oci:{layout.folder}:v1", "twice",
                                             over=OverExisting.UPDATE)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            results["second"] = exc
        second_done.set()

    threads: list[threading.Thread] = []

    def progress(event):
        if event.get("status") == "fetching" and not threads:
            threads.append(threading.Thread(target=second, daemon=True))
            threads[0].start()
            second_done.wait(5)  # the second import runs now, unless it waits its turn

    try:
        results["first"] = import_image(config, f"docker://{host}/site/twice:v1", "twice",
                                        progress, over=OverExisting.UPDATE)
    except Exception as exc:  # noqa: BLE001
        results["first"] = exc
    threads[0].join(120)
    assert second_done.is_set()
    assert not any(isinstance(r, Exception) for r in results.values()), results
    assert results["first"]["layers"] == results["second"]["layers"]
    assert load_manifest(config, "twice")["layers"] == results["first"]["layers"]
    assert sorted(p.name for p in (config.state_dir / "recipes").iterdir()) == ["twice"]
