"""The settings of an etcd store's access: etcds:// URLs, store_tls and store_auth in
provisiond.yaml and as `provisiond init` flags, their files checked in one line each."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives import serialization

from provisiond.cli import main
from provisiond.config import (StoreAuthSettings, StoreTlsSettings, load_config,
                               parse_store_url)
from provisiond.errors import InvalidConfig, Unavailable
from provisiond.state import etcd
from provisiond.state.etcd import EtcdStore, read_password, tls_files
from provisiond.state.open import open_store
from tests.etcd_cluster import free_ports, make_tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def password(tmp_path):
    path = tmp_path / "etcd-password"
    path.write_text("s3cret words\nignored\n")
    path.chmod(0o600)
    return path


def _provisiond(state_dir, capsys, *args):
    capsys.readouterr()
    code = main(["--state-dir", str(state_dir), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# the URL

def test_etcds_is_the_tls_scheme():
    assert parse_store_url("etcds://127.0.0.1:2379,[::1]:2380/site") == (
        [("127.0.0.1", 2379), ("::1", 2380)], "/site/", True)
    assert parse_store_url("etcd://127.0.0.1:2379").tls is False
    with pytest.raises(ValueError, match="etcds://"):
        parse_store_url("https://127.0.0.1:2379")


# provisiond.yaml

def test_store_tls_and_auth_are_read_and_reach_the_store(state_dir, tls, password):
    (state_dir / "provisiond.yaml").write_text(
        "store: etcds://127.0.0.1:2379,127.0.0.1:2380/site\n"
        f"store_tls: {{ca_file: {tls.ca_file}, cert_file: {tls.client_cert}, "
        f"key_file: {tls.client_key}}}\n"
        f"store_auth: {{user: provisiond, password_file: {password}}}\n")
    config = load_config(state_dir)
    assert config.store_tls == StoreTlsSettings(ca_file=tls.ca_file, cert_file=tls.client_cert,
                                                key_file=tls.client_key)
    store = open_store(config)
    assert [client.base_url for client in store.clients] == [
        "https://127.0.0.1:2379", "https://127.0.0.1:2380"]
    session = store.clients[0].session
    assert session.verify == str(tls.ca_file)
    assert session.cert == (str(tls.client_cert), str(tls.client_key))
    assert session.trust_env is False  # $REQUESTS_CA_BUNDLE would replace the CA file
    assert store.auth.user == "provisiond" and store._password == "s3cret words"


@pytest.mark.parametrize("settings, message", [
    ("store: etcd://127.0.0.1:2379\nstore_tls: {ca_file: /ca.pem}",
     "store_tls: for an etcds:// store"),
    ("store_auth: {user: u, password_file: /p}", "store_auth: for an etcd store"),
    ("store: etcds://127.0.0.1:2379\nstore_tls: {cert_file: /c.pem}",
     "store_tls: cert_file and key_file go together"),
    ("store: etcds://127.0.0.1:2379\nstore_tls: {ca_file: ca.pem}",
     "store_tls.ca_file: 'ca.pem': an absolute path"),
    ("store: etcds://127.0.0.1:2379\nstore_tls: {cafile: /ca.pem}",
     "store_tls.cafile: unknown setting"),
    ("store: etcd://127.0.0.1:2379\nstore_auth: {user: u}", "store_auth.password_file"),
    ("store: etcd://127.0.0.1:2379\nstore_auth: {user: '', password_file: /p}",
     "store_auth.user"),
])
def test_a_bad_store_access_setting_is_one_line(state_dir, settings, message):
    (state_dir / "provisiond.yaml").write_text(settings + "\n")
    with pytest.raises(InvalidConfig, match=f"provisiond.yaml: {message}") as caught:
        load_config(state_dir)
    assert "\n" not in str(caught.value)


# the files

def test_the_password_is_the_first_line_of_a_file_only_its_owner_reads(password):
    settings = StoreAuthSettings(user="u", password_file=password)
    assert read_password(settings) == "s3cret words"
    password.chmod(0o640)
    with pytest.raises(InvalidConfig, match=rf"store_auth.password_file: {password} is mode "
                                            rf"0640: others may read it; chmod 600"):
        read_password(settings)
    password.chmod(0o600)
    password.write_bytes(b"s3cret words \r\n")  # written on Windows; its spaces are its own
    assert read_password(settings) == "s3cret words "
    password.write_bytes(b"s3cret w\xf6rds\n")  # Latin-1: replaced, it was a wrong password
    with pytest.raises(InvalidConfig, match=rf"password_file: {password}: not UTF-8 text$"):
        read_password(settings)
    password.write_text("\n")
    with pytest.raises(InvalidConfig, match="empty"):
        read_password(settings)
    with pytest.raises(InvalidConfig, match="No such file"):
        read_password(StoreAuthSettings(user="u", password_file=password.parent / "none"))
    with pytest.raises(InvalidConfig, match="not a regular file"):
        read_password(StoreAuthSettings(user="u", password_file=password.parent))


def test_tls_files_are_checked_in_one_line_naming_the_setting(tls, tmp_path):
    assert tls_files(StoreTlsSettings()) == (True, None)  # the system's CAs
    missing = tmp_path / "missing.pem"
    with pytest.raises(InvalidConfig, match=f"store_tls.ca_file: {missing}: No such file"):
        tls_files(StoreTlsSettings(ca_file=missing))
    (tmp_path / "text.pem").write_text("not a certificate\n")
    with pytest.raises(InvalidConfig, match="store_tls.ca_file: .*no PEM certificate"):
        tls_files(StoreTlsSettings(ca_file=tmp_path / "text.pem"))
    with pytest.raises(InvalidConfig, match=f"store_tls.key_file: {missing}: No such file"):
        tls_files(StoreTlsSettings(cert_file=tls.client_cert, key_file=missing))
    with pytest.raises(InvalidConfig, match="not a PEM certificate and its unencrypted key"):
        tls_files(StoreTlsSettings(cert_file=tls.client_cert, key_file=tls.named_client_key))


def test_an_encrypted_key_is_refused_without_asking_for_its_passphrase(tls, tmp_path):
    key = serialization.load_pem_private_key(tls.client_key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    with pytest.raises(InvalidConfig, match="unencrypted key"):
        tls_files(StoreTlsSettings(cert_file=tls.client_cert, key_file=encrypted))


# no member reachable

def test_no_member_taking_connections_fails_in_unreachable_for_not_retry_for(
        tmp_path, monkeypatch):
    monkeypatch.setattr(etcd, "UNREACHABLE_FOR", 0.5)
    monkeypatch.setattr(etcd, "RETRY_FOR", 20.0)  # (its own failure names the 20 s)
    ports = free_ports(2)
    members = [f"127.0.0.1:{ports[0]}", f"[::1]:{ports[1]}"]  # named as in the URL
    store = EtcdStore(f"etcd://{','.join(members)}", tmp_path / "k")
    with pytest.raises(Unavailable, match=r"no member took a connection for 0.5 s") as caught:
        store.get("inventory.yaml")
    for member in members:
        assert f"{member}: connection refused" in str(caught.value)


# provisiond init

def test_init_writes_the_store_access_settings(tmp_path, capsys, tls, password):
    url = "etcds://127.0.0.1:23791/site"
    code, _, err = _provisiond(
        tmp_path / "s", capsys, "init", "--no-profiles", "--store", url,
        "--store-ca", str(tls.ca_file), "--store-cert", str(tls.client_cert),
        "--store-key", str(tls.client_key), "--store-user", "provisiond",
        "--store-password-file", str(password))
    assert code == 0, err
    config = load_config(tmp_path / "s")
    assert (config.store, config.store_tls.ca_file, config.store_tls.key_file) == (
        url, tls.ca_file, tls.client_key)
    assert config.store_auth == StoreAuthSettings(user="provisiond", password_file=password)
    assert "s3cret" not in (tmp_path / "s" / "provisiond.yaml").read_text()
    # again with the same flags: kept; with another CA: refused, nothing changed
    code, _, err = _provisiond(tmp_path / "s", capsys, "init", "--no-profiles", "--store", url,
                               "--store-ca", str(tls.ca_file))
    assert code == 0, err
    code, _, err = _provisiond(tmp_path / "s", capsys, "init", "--no-profiles", "--store", url,
                               "--store-ca", str(tls.client_cert))
    assert code == 2 and err.count("\n") == 1 and f"has store_tls: {{'ca_file': " in err
    assert load_config(tmp_path / "s").store_tls.ca_file == tls.ca_file


@pytest.mark.parametrize("flags, message", [
    (["--store", "etcd://127.0.0.1:1", "--store-ca", "CA"], "for an etcds:// store"),
    (["--store", "etcds://127.0.0.1:1", "--store-cert", "CERT"],
     "--store-cert and --store-key go together"),
    (["--store", "etcds://127.0.0.1:1", "--store-user", "u"],
     "--store-user and --store-password-file go together"),
    (["--store-user", "u", "--store-password-file", "PASSWORD"], "add --store"),
    (["--store", "etcds://127.0.0.1:1", "--store-ca", "MISSING"],
     "store_tls.ca_file: .*missing: No such file"),
    (["--store", "etcd://127.0.0.1:1", "--store-user", "u", "--store-password-file", "OPEN"],
     "store_auth.password_file: .* is mode 0644"),
])
def test_init_refuses_bad_store_access_flags_writing_nothing(
        tmp_path, capsys, tls, password, flags, message):
    opened = tmp_path / "open-password"
    opened.write_text("x\n")
    opened.chmod(0o644)
    files = {"CA": tls.ca_file, "CERT": tls.client_cert, "PASSWORD": password,
             "MISSING": tmp_path / "missing", "OPEN": opened}
    code, _, err = _provisiond(tmp_path / "s", capsys, "init", "--no-profiles",
                               *[str(files.get(flag, flag)) for flag in flags])
    assert code == 2 and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert not (tmp_path / "s" / "provisiond.yaml").exists()


def test_a_member_whose_host_does_not_answer_costs_the_connect_timeout(tmp_path, monkeypatch):
    """A listener whose accept queue is full drops new connections without a refusal (as
    a host that is down does): each attempt ends at CONNECT_TIMEOUT, not the request
    timeout, so the unreachable bound, not RETRY_FOR, ends the call."""
    monkeypatch.setattr(etcd, "UNREACHABLE_FOR", 0.5)
    monkeypatch.setattr(etcd, "RETRY_FOR", 8.0)
    monkeypatch.setattr(etcd, "CONNECT_TIMEOUT", 1.0)
    with silent_member() as port:
        store = EtcdStore(f"etcd://127.0.0.1:{port}", tmp_path / "k", timeout=30.0)
        with pytest.raises(Unavailable, match=r"no member took a connection for 0.5 s "
                                              r"\(127.0.0.1:\d+: timed out\)"):
            store.get("inventory.yaml")


@contextlib.contextmanager
def silent_member() -> Iterator[int]:
    """The port of a listener whose accept queue is full: new connections are dropped
    without a refusal, as by a host that is down."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        with socket.create_connection(full.getsockname(), timeout=5):  # fills the queue
            yield full.getsockname()[1]


def test_threads_waiting_on_a_token_from_a_member_that_does_not_answer_share_its_failure(
        tmp_path, monkeypatch, password):
    """A token is taken by one thread at a time per member; when that member's host does
    not answer, the threads that waited take the failure and try the next member, instead
    of each trying again after the other (8 threads: 8 connect timeouts in a row)."""
    monkeypatch.setattr(etcd, "UNREACHABLE_FOR", 0.5)
    monkeypatch.setattr(etcd, "CONNECT_TIMEOUT", 1.0)
    with silent_member() as port:
        store = EtcdStore(f"etcd://127.0.0.1:{port}", tmp_path / "k",
                          auth=StoreAuthSettings(user="u", password_file=password))
        attempts, failures = [], []
        authenticate = store._authenticate
        store._authenticate = lambda member: attempts.append(1) or authenticate(member)

        def get() -> None:
            with pytest.raises(Unavailable, match="no member took a connection") as caught:
                store.get("inventory.yaml")
            failures.append(caught.value)

        threads = [threading.Thread(target=get) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(failures) == 8
    assert len(attempts) < 8, attempts  # about one per UNREACHABLE_FOR round, not per thread
