"""`image import docker://...` from a private registry: Debian's docker-registry on
127.0.0.1 with htpasswd (bcrypt) logins over TLS from a CA the test makes, and one asking
for bearer tokens from a token service that wants the login; skopeo pushes with
--dest-creds. (docker-registry 2.8 does not require TLS for htpasswd: the TLS here is the
private-CA case, not a need of the registry.)"""

from __future__ import annotations

import base64
import datetime
import io
import ipaddress
import json
import shutil
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from provisiond.errors import BuildFailed, InvalidInput
from provisiond.images import load_manifest, registry_access
from tests.integration.test_images_oci import unpack_image
from tests.integration.test_images_registry import (Layout, nothing_stored, push,
                                                    running_registry, three_layers,
                                                    token_registry_running)
from tests.conftest import CliResult
from tests.tools import tool

pytestmark = pytest.mark.skipif(not (tool("docker-registry") and tool("skopeo")),
                                reason="docker-registry or skopeo is not installed")
USER, PASSWORD = "bob", "s3cret-Pw:with colon"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_ca(folder: Path, client: Path | None = None) -> tuple[Path, dict]:
    """A CA (ca.crt) and a certificate it signs for 127.0.0.1; returns (CA path, the
    registry's tls section). With `client`, also a client certificate it signs there
    (client.cert, client.key, as in containers-certs.d(5))."""
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {"not_valid_before": now - datetime.timedelta(days=1),
             "not_valid_after": now + datetime.timedelta(days=1)}
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder(**valid).subject_name(_name("provisiond test CA"))
          .issuer_name(_name("provisiond test CA")).public_key(ca_key.public_key())
          .serial_number(1).add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder(**valid).subject_name(_name("127.0.0.1"))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(2)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    (folder / "certs").mkdir()
    ca_path = folder / "certs/ca.crt"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    if client:
        client_key = ec.generate_private_key(ec.SECP256R1())
        client_cert = (x509.CertificateBuilder(**valid).subject_name(_name("provisiond"))
                       .issuer_name(ca.subject).public_key(client_key.public_key())
                       .serial_number(3).sign(ca_key, hashes.SHA256()))
        client.mkdir(parents=True, exist_ok=True)
        (client / "client.cert").write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
        (client / "client.key").write_bytes(client_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return ca_path, {"certificate": str(folder / "server.pem"), "key": str(folder / "server.key")}


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """The htpasswd registry over TLS, holding site/private:v1; yields (host, CA path)."""
    folder = tmp_path_factory.mktemp("private-registry")
    ca, tls = make_ca(folder)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()
    (folder / "htpasswd").write_text(f"{USER}:{hashed}\n")
    auth = {"htpasswd": {"realm": "provisiond-test", "path": str(folder / "htpasswd")}}
    with running_registry(folder, auth, tls) as (host, _):
        layout = Layout(folder / "layout")
        layout.tag("v1", layout.image(three_layers("private")))
        push(layout, "v1", f"{host}/site/private:v1", "--preserve-digests",
             "--dest-creds", f"{USER}:{PASSWORD}")
        yield host, ca


@pytest.fixture(scope="module")
def mutual(tmp_path_factory):
    """A registry over TLS that takes only clients with a certificate its CA signed (no
    login), holding site/mutual:v1; yields (host, CA path, folder of client.cert/.key)."""
    folder = tmp_path_factory.mktemp("mutual-tls-registry")
    ca, tls = make_ca(folder, client=folder / "client")
    with running_registry(folder, None, {**tls, "clientcas": [str(ca)]}) as (host, _):
        layout = Layout(folder / "layout")
        layout.tag("v1", layout.image(three_layers("mutual")))
        push(layout, "v1", f"{host}/site/mutual:v1", "--preserve-digests",
             "--dest-cert-dir", str(folder / "client"))
        yield host, ca, folder / "client"


@pytest.fixture
def certs_d(monkeypatch, tmp_path):
    """The certs.d trees the code reads, the test's own (never /etc): returns a function
    giving the folder for HOST under containers' or docker's."""
    bases = {"containers": tmp_path / "etc/containers/certs.d",
             "docker": tmp_path / "etc/docker/certs.d"}
    monkeypatch.setattr(registry_access, "CERTS_D", tuple(bases.values()))
    return lambda which, host: bases[which] / host


def test_the_registry_folder_of_docker_certs_d_is_trusted_by_default(cli, config, private,
                                                                      certs_d, tmp_path):
    host, ca = private
    folder = certs_d("docker", host)
    folder.mkdir(parents=True)
    shutil.copy(ca, folder / "ca.crt")
    result = cli("image", "import", f"docker://{host}/site/private:v1", "certsd",
                 "--creds", f"{USER}:{PASSWORD}")
    assert result.code == 0, result.err
    assert imported(config, "certsd", tmp_path) == b"private"


def test_a_client_certificate_from_certs_d(cli, config, mutual, certs_d, tmp_path):
    host, ca, client = mutual
    args = ["image", "import", f"docker://{host}/site/mutual:v1"]
    folder = certs_d("containers", host)
    folder.mkdir(parents=True)
    shutil.copy(ca, folder / "ca.crt")
    result = cli(*args, "nocert")  # the registry ends the handshake: no certificate
    assert one_line(result, BuildFailed.exit_code, f"cannot reach {host}"), result.err
    shutil.copy(client / "client.cert", folder / "client.cert")
    result = cli(*args, "halfcert")
    assert one_line(result, InvalidInput.exit_code, f"{folder / 'client.cert'}: a client "
                    "certificate without its client.key"), result.err
    assert nothing_stored(config, "nocert") and nothing_stored(config, "halfcert")
    shutil.copy(client / "client.key", folder / "client.key")
    result = cli(*args, "mutual")
    assert result.code == 0, result.err
    assert imported(config, "mutual", tmp_path) == b"mutual"


def test_cert_dir_replaces_the_certs_d_folder(cli, config, private, certs_d, tmp_path):
    host, ca = private
    folder = certs_d("containers", host)
    folder.mkdir(parents=True)
    (folder / "ca.crt").write_text("not a certificate")
    result = cli("image", "import", f"docker://{host}/site/private:v1", "certdir",
                 "--creds", f"{USER}:{PASSWORD}", "--cert-dir", str(ca.parent))
    assert result.code == 0, result.err


@pytest.fixture(autouse=True)
def no_auth_files_of_the_machine(monkeypatch, tmp_path):
    """Only the auth files a test writes: HOME and the XDG folders are the test's."""
    for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def imported(config, name: str, tmp_path: Path) -> bytes:
    """The /etc/mark of the imported image (its layers unpacked)."""
    unpack_image(config, load_manifest(config, name), tmp_path / name)
    return (tmp_path / name / "etc/mark").read_bytes()


def no_secret_stored(config, result) -> bool:
    """The password is in no file of the state dir (manifest, recipe, layers, logs) and
    in nothing printed."""
    secret = PASSWORD.encode()
    files = [p for p in config.state_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    return not any(secret in p.read_bytes() for p in files) and \
        PASSWORD not in result.out + result.err


def one_line(result, code: int, *parts: str) -> bool:
    return (result.code == code and result.err.count("\n") == 1 and "Traceback" not in
            result.err and all(part in result.err for part in parts))


def test_creds_and_a_ca_file(cli, config, private, tmp_path):
    host, ca = private
    result = cli("image", "import", f"docker://{host}/site/private:v1", "priv",
                 "--creds", f"{USER}:{PASSWORD}", "--ca-file", str(ca))
    assert result.code == 0, result.err
    assert imported(config, "priv", tmp_path) == b"private"
    assert no_secret_stored(config, result)


def test_an_auth_file_and_a_cert_dir(cli, config, private, tmp_path):
    host, ca = private
    authfile = tmp_path / "auth.json"
    authfile.write_text(json.dumps({"auths": {host: {"auth": BASIC.split()[1]}}}))
    result = cli("image", "import", f"docker://{host}/site/private:v1", "fromfile",
                 "--authfile", str(authfile), "--cert-dir", str(ca.parent))
    assert result.code == 0, result.err
    assert imported(config, "fromfile", tmp_path) == b"private"


def test_the_docker_config_of_home_is_read_by_default(cli, config, private, tmp_path):
    host, ca = private
    (tmp_path / "home/.docker").mkdir(parents=True)
    (tmp_path / "home/.docker/config.json").write_text(json.dumps(
        {"auths": {host: {"auth": BASIC.split()[1]}}}))
    result = cli("image", "import", f"docker://{host}/site/private:v1", "fromhome",
                 "--ca-file", str(ca))
    assert result.code == 0, result.err


def test_password_stdin(cli, config, private, monkeypatch, tmp_path):
    host, ca = private
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    result = cli("image", "import", f"docker://{host}/site/private:v1", "stdin",
                 "--creds", USER, "--password-stdin", "--ca-file", str(ca))
    assert result.code == 0, result.err
    assert no_secret_stored(config, result)


def test_a_wrong_password_is_one_line_and_stores_nothing(cli, config, private):
    host, ca = private
    result = cli("image", "import", f"docker://{host}/site/private:v1", "wrong",
                 "--creds", f"{USER}:not-{PASSWORD}", "--ca-file", str(ca))
    assert one_line(result, BuildFailed.exit_code,
                    f"{host} refused the login for user {USER} (HTTP 401)"), result.err
    assert nothing_stored(config, "wrong") and no_secret_stored(config, result)


def test_no_credentials_is_one_line(cli, config, private):
    host, ca = private
    result = cli("image", "import", f"docker://{host}/site/private:v1", "anon",
                 "--ca-file", str(ca))
    assert one_line(result, BuildFailed.exit_code, f"{host} asks for a login; give --creds"), \
        result.err
    assert nothing_stored(config, "anon")


def test_a_password_neither_given_nor_asked_for_is_one_line(cli, config, private,
                                                            monkeypatch):
    host, ca = private
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    result = cli("image", "import", f"docker://{host}/site/private:v1", "nopw",
                 "--creds", USER, "--ca-file", str(ca))
    assert one_line(result, InvalidInput.exit_code, f"no password for {USER}"), result.err


def test_an_untrusted_ca_is_one_line_and_tls_verify_false_accepts_it(cli, config, private,
                                                                     tmp_path):
    host, _ = private
    args = ["image", "import", f"docker://{host}/site/private:v1", "untrusted",
            "--creds", f"{USER}:{PASSWORD}"]
    result = cli(*args)
    assert one_line(result, BuildFailed.exit_code, f"the TLS certificate of {host} is not "
                    "trusted", "--ca-file"), result.err
    assert nothing_stored(config, "untrusted")
    result = cli(*args, "--tls-verify=false")
    assert result.code == 0, result.err
    assert imported(config, "untrusted", tmp_path) == b"private"


def test_tls_verify_takes_its_value_only_after_an_equals_sign(cli, config, private,
                                                              tmp_path, capsys):
    """As skopeo and podman read it: a bare --tls-verify is true and the next word is the
    SOURCE; `--tls-verify false SOURCE NAME` is one line (a usage error), not a silent
    false."""
    host, ca = private
    source = f"docker://{host}/site/private:v1"
    creds = ("--creds", f"{USER}:{PASSWORD}")
    result = cli("image", "import", *creds, "--tls-verify", source, "bare")
    assert one_line(result, BuildFailed.exit_code, f"the TLS certificate of {host} is not "
                    "trusted"), result.err
    result = cli("image", "import", *creds, "--ca-file", str(ca), "--tls-verify", source,
                 "verified")
    assert result.code == 0, result.err
    for words in ((source, "spaced"), (source,), (source, "--tls-verify", "false")):
        with pytest.raises(SystemExit) as usage:  # NAME forgotten, or false as NAME
            cli("image", "import", *creds, "--tls-verify", "false", *words)
        result = CliResult(usage.value.code, "", capsys.readouterr().err)
        assert one_line(result, InvalidInput.exit_code, "--tls-verify takes its value after "
                        "'=': --tls-verify=false"), result.err
    with pytest.raises(SystemExit) as usage:
        cli("image", "import", "--tls-verify=maybe", source, "maybe")
    result = CliResult(usage.value.code, "", capsys.readouterr().err)
    assert one_line(result, InvalidInput.exit_code, "expected true or false"), result.err
    result = cli("image", "import", source, "x", "y")
    assert one_line(result, InvalidInput.exit_code, "takes SOURCE NAME; unexpected: y"), \
        result.err
    result = cli("image", "import", *creds, "--tls-verify=False", source, "unverified")
    assert result.code == 0, result.err
    assert imported(config, "unverified", tmp_path) == b"private"
    assert not (config.images_dir / "spaced").exists()


def test_registry_options_with_another_source_are_refused(cli, tmp_path):
    result = cli("image", "import", f"oci:{tmp_path}:v1", "x", "--creds", "bob:pw")
    assert one_line(result, InvalidInput.exit_code, "for docker:// sources only"), result.err


@pytest.fixture(scope="module")
def login_tokens(tmp_path_factory):
    """docker-registry (plain HTTP, loopback) asking for bearer tokens from a token service
    that gives them only to bob's Basic login."""
    with token_registry_running(tmp_path_factory.mktemp("login-token-registry"),
                                login=BASIC) as running:
        yield running


def test_a_token_is_fetched_with_the_login(cli, config, login_tokens, tmp_path):
    host, tokens = login_tokens
    layout = Layout(tmp_path / "layout")
    layout.tag("v1", layout.image(three_layers("login-token")))
    push(layout, "v1", f"{host}/site/tok:v1", "--preserve-digests",
         "--dest-creds", f"{USER}:{PASSWORD}")
    tokens.logins.clear()
    result = cli("image", "import", f"docker://{host}/site/tok:v1", "tok",
                 "--creds", f"{USER}:{PASSWORD}")
    assert result.code == 0, result.err
    assert tokens.logins == [BASIC]
    assert imported(config, "tok", tmp_path) == b"login-token"
    result = cli("image", "import", f"docker://{host}/site/tok:v1", "tokwrong",
                 "--creds", f"{USER}:wrong")
    assert one_line(result, BuildFailed.exit_code, f"{host} (its token service "
                    f"{tokens.realm.split('/')[2]}) refused the login for user {USER}"), \
        result.err
    assert sorted(p.name for p in (config.state_dir / "recipes").iterdir()) == ["tok"]
    assert not (config.images_dir / "tokwrong").exists()
