"""The etcd store over TLS and as an etcd user, against real members on loopback: client
certificates (--client-cert-auth), a user whose role holds the store's key prefix only,
simple tokens that expire (--auth-token-ttl) and are renewed; each refusal one line through
the CLI."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest
import requests

from provisiond.cli import main
from provisiond.boot.table import TableWatcher
from provisiond.config import Config, StoreAuthSettings, StoreTlsSettings
from provisiond.state.etcd import EtcdStore, StoreDenied
from provisiond.state.store import Entry
from tests.etcd_cluster import ETCD, EtcdCluster, make_tls
from tests.waits import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ETCD.is_file(), reason="needs Debian's etcd-server")]

TOKEN_TTL = 2  # seconds an unused simple token lives (--auth-token-ttl)
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, tls):
    """One member speaking TLS to clients, requiring their certificate; no users."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd-tls"), size=1, tls=tls) as running:
        yield running


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory, tls):
    """Three members with TLS, client certificates and authentication on: the user
    provisiond may read and write the keys starting with /site (the store at /site:
    /site/..., /site.receipts/..., /site.key-id), the user intruder those of /other."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd-auth"), tls=tls,
                     flags=("--auth-token-ttl", str(TOKEN_TTL))) as running:
        for command in (["user", "add", "root", "--new-user-password", "root-password"],
                        ["role", "add", "site"],
                        ["role", "grant-permission", "site", "readwrite", "/site", "--prefix"],
                        ["user", "add", "provisiond", "--new-user-password", PASSWORD],
                        ["user", "grant-role", "provisiond", "site"],
                        ["role", "add", "other"],
                        ["role", "grant-permission", "other", "readwrite", "/other", "--prefix"],
                        ["user", "add", "intruder", "--new-user-password", PASSWORD],
                        ["user", "grant-role", "intruder", "other"],
                        ["auth", "enable"]):
            running.etcdctl(*command)
        running.ctl_user = "root:root-password"
        yield running


@pytest.fixture
def password(tmp_path):
    path = tmp_path / "etcd-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


def _client_tls(tls) -> StoreTlsSettings:
    return StoreTlsSettings(ca_file=tls.ca_file, cert_file=tls.client_cert,
                            key_file=tls.client_key)


def _site(cluster, name: str = "site") -> str:
    """A store URL under /site (the role's prefix) of its own."""
    return cluster.url(f"/{name}/{uuid.uuid4().hex[:8]}")


def _cli(tmp_path, capsys, settings: str, *args: str):
    """`provisiond ARGS` with a provisiond.yaml of `settings`: (code, out, err)."""
    state = tmp_path / f"state-{uuid.uuid4().hex[:8]}"
    state.mkdir()
    (state / "provisiond.yaml").write_text(settings)
    capsys.readouterr()
    code = main(["--state-dir", str(state), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _settings(url: str, ca=None, cert=None, key=None, user=None, password=None) -> str:
    tls = {"ca_file": ca, "cert_file": cert, "key_file": key}
    text = f"store: {url}\n"
    if any(tls.values()):
        text += "store_tls: {%s}\n" % ", ".join(f"{k}: {v}" for k, v in tls.items() if v)
    if user:
        text += f"store_auth: {{user: {user}, password_file: {password}}}\n"
    return text


# TLS

def test_a_store_over_tls_with_a_client_certificate(tls_cluster, tls, tmp_path, monkeypatch):
    # a CA bundle in the environment (as on this machine) must not replace store_tls.ca_file
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    url = _site(tls_cluster)
    store = EtcdStore(url, tmp_path / "store.key", tls=_client_tls(tls))
    since = store.revision()
    store.put("inventory.yaml", b"nodes: {}\n")
    store.put("secrets.yaml", b"password: hunter2\n")
    assert store.get("secrets.yaml").value == b"password: hunter2\n"
    assert [c.key for c in store.watch("", since, timeout=5)] == ["inventory.yaml",
                                                                   "secrets.yaml"]


def test_tls_refusals_are_one_line_each(tls_cluster, tls, tmp_path, capsys):
    other = make_tls(tmp_path / "other", "another")
    url = _site(tls_cluster)
    cases = [
        (_settings(url, other.ca_file, tls.client_cert, tls.client_key),
         "no member completed the TLS handshake .*TLS: the member.s certificate does not "
         "verify against store_tls.ca_file, or does not name the address the URL gives "
         "\\(certificate verify failed"),
        (_settings(url, tls.ca_file),  # Go's TLS answers with an alert or a close
         "TLS: the member (requires a client certificate|ended the handshake: it wants a "
         "client certificate|refused the client certificate, or wants one)"),
        (_settings(url, tls.ca_file, other.client_cert, other.client_key),
         "TLS: the member (refused the client certificate|ended the handshake: it wants a "
         "client certificate signed by a CA of its --trusted-ca-file)"),
        (_settings(url, tmp_path / "missing.pem"),
         f"store_tls.ca_file: {tmp_path}/missing.pem: No such file or directory"),
        (_settings(url, tls.ca_file, tls.client_cert, tmp_path / "missing.key"),
         f"store_tls.key_file: {tmp_path}/missing.key: No such file or directory"),
        (_settings(url.replace("etcds://", "etcd://")),
         "no member took a connection for 5 s \\(members that speak TLS close plain "
         "connections: etcds://\\?\\)"),
    ]
    _each_one_line(tmp_path, capsys, cases)


# an etcd user

def test_a_user_whose_role_holds_the_prefix_reads_writes_and_watches(
        auth_cluster, tls, password, tmp_path):
    auth = StoreAuthSettings(user="provisiond", password_file=password)
    url = _site(auth_cluster)
    store = EtcdStore(url, tmp_path / "store.key", tls=_client_tls(tls), auth=auth)
    since = store.revision()
    revision = store.put("inventory.yaml", b"nodes: {}\n", expect=0)  # a receipt too
    store.put("secrets.yaml", b"password: hunter2\n")  # the key id too
    assert store.get("inventory.yaml").revision == revision
    assert [c.key for c in store.watch("", since, timeout=5)] == ["inventory.yaml",
                                                                   "secrets.yaml"]
    # another server, starting at the last member (whose token is its own)
    other = EtcdStore(auth_cluster.url(url[url.index("/", 8):], [2, 1, 0]),
                      tmp_path / "store.key", tls=_client_tls(tls), auth=auth)
    assert other.get("secrets.yaml").value == b"password: hunter2\n"
    assert list(other._tokens) == [other.clients[0]] and other._tokens[other.clients[0]]


def test_an_expired_token_is_renewed(auth_cluster, tls, password, tmp_path):
    auth = StoreAuthSettings(user="provisiond", password_file=password)
    store = EtcdStore(_site(auth_cluster), tmp_path / "store.key", tls=_client_tls(tls),
                      auth=auth)
    store.put("status/n1.json", b"up")
    client = store.clients[store._preferred]
    token = store._tokens[client]
    _wait_forgotten(client, token)
    assert store.get("status/n1.json").value == b"up"
    assert store._tokens[client] not in (None, token)
    # a watch whose token expired is refused as "permission denied": renewed as well
    since = store.put("status/n1.json", b"down") - 1
    token = store._tokens[client]
    _wait_forgotten(client, token)
    assert [c.value for c in store.watch("status/", since, timeout=5)] == [b"down"]
    assert store._tokens[client] != token


def test_user_refusals_are_one_line_each_and_never_show_the_password(
        auth_cluster, tls, password, tmp_path, capsys):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not the password\n")
    wrong.chmod(0o600)
    readable = tmp_path / "readable-password"
    readable.write_text(PASSWORD + "\n")
    readable.chmod(0o644)
    url = _site(auth_cluster)
    files = {"ca": tls.ca_file, "cert": tls.client_cert, "key": tls.client_key}
    named = {"ca": tls.ca_file, "cert": tls.named_client_cert, "key": tls.named_client_key}
    cases = [
        (_settings(url, **files, user="provisiond", password=wrong),
         "user 'provisiond' was refused: a wrong user name or password "
         f"\\(store_auth.password_file {wrong}\\)"),
        (_settings(url, **files),
         "requires a user \\(etcdserver: user name is empty\\): set store_auth"),
        (_settings(url, **files, user="intruder", password=password),
         f"permission denied to user 'intruder' for inventory.yaml: its role needs "
         f"readwrite on the keys starting with {url[url.index('/', 8):]}"),
        (_settings(url, **files, user="provisiond", password=readable),
         f"store_auth.password_file: {readable} is mode 0644: others may read it"),
        (_settings(url, **named, user="provisiond", password=password),
         "etcd refuses a client certificate with a Common Name when its authentication "
         "is on"),
    ]
    for err in _each_one_line(tmp_path, capsys, cases):
        assert PASSWORD not in err and "not the password" not in err
    code, out, err = _cli(tmp_path, capsys, _settings(url, **files, user="provisiond",
                                                      password=password), "node", "list")
    assert code == 0, err


def test_a_refused_user_stops_no_server(auth_cluster, tls, password, tmp_path, caplog):
    """Every kind of call is StoreDenied (a ProvisiondError: an API request gets its JSON
    error), and `serve`'s inventory watcher logs it and keeps serving its table."""
    auth = StoreAuthSettings(user="intruder", password_file=password)
    url = _site(auth_cluster)
    store = EtcdStore(url, tmp_path / "store.key", tls=_client_tls(tls), auth=auth)
    for call in (lambda: store.get("inventory.yaml"), lambda: store.watch("", 0, 1),
                 lambda: store.put("status/n1.json", b"x", expect=0)):
        with pytest.raises(StoreDenied, match="permission denied to user 'intruder'"):
            call()
    config = Config(state_dir=tmp_path, store=url, store_tls=_client_tls(tls), store_auth=auth)
    watcher = TableWatcher(config)
    assert watcher.wait_changed(0.1) is False and watcher.table.nodes == {}
    assert "permission denied to user 'intruder'" in caplog.text


def _wait_forgotten(client, token: str) -> None:
    """Until the member no longer knows `token` (each use renews its TTL: look less
    often)."""
    def forgotten() -> bool:
        time.sleep(TOKEN_TTL + 0.5)
        reply = requests.post(client.get_url("kv/range"), json={"key": "eA=="},
                              headers={"Authorization": token}, verify=client.session.verify,
                              cert=client.session.cert, timeout=10)
        return "invalid auth token" in reply.text

    wait_until(forgotten, 60, f"etcd forgetting the token after {TOKEN_TTL} s")



def test_threads_renewing_tokens_at_once_all_succeed(auth_cluster, tls, password, tmp_path):
    """serve's threads share one store: when a member forgets the token (expired, or the
    member restarted), the threads that find out at once must each get their answer (a
    renewal clearing the member's token under the others' requests made them fail as 'user
    name is empty', then StoreDenied), and take one new token, not one each."""
    auth = StoreAuthSettings(user="provisiond", password_file=password)
    store = EtcdStore(_site(auth_cluster), tmp_path / "store.key", tls=_client_tls(tls),
                      auth=auth)
    store.put("status/n1.json", b"up")
    client = store.clients[store._preferred]
    threads_count, rounds = 8, 3
    start = threading.Barrier(threads_count + 1, timeout=60)
    errors, renewals = [], []
    authenticate = store._authenticate
    store._authenticate = lambda member: renewals.append(member) or authenticate(member)

    def reader() -> None:
        for _ in range(rounds):
            start.wait()
            try:
                assert store.get("status/n1.json").value == b"up"
            except Exception as exc:  # noqa: BLE001 (collected for the assertion below)
                errors.append(repr(exc))
            start.wait()

    threads = [threading.Thread(target=reader) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for _ in range(rounds):
        _wait_forgotten(client, store._tokens[client])
        start.wait()
        start.wait()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(renewals) == rounds  # one a round (each is a bcrypt and a raft write in etcd)


def test_a_user_store_goes_on_while_a_member_is_stopped_and_after_it_restarts(
        auth_cluster, tls, password, tmp_path):
    """One member of three stopped costs a retry, not a failed call, with a user as
    without; restarted, it has forgotten the token it gave: renewed there."""
    auth = StoreAuthSettings(user="provisiond", password_file=password)
    store = EtcdStore(_site(auth_cluster), tmp_path / "store.key", tls=_client_tls(tls),
                      auth=auth)
    first = store.clients[0]
    store.put("status/n1.json", b"up")
    assert store._preferred == 0 and store._tokens[first]
    token = store._tokens[first]
    auth_cluster.stop_member(0)
    try:
        for value in (b"a", b"b", b"c"):
            revision = store.put("status/n1.json", value, expect=store.get(
                "status/n1.json").revision)
            assert store.get("status/n1.json") == Entry("status/n1.json", value, revision)
    finally:
        auth_cluster.start_member(0)
    store._preferred = 0  # the restarted member first again
    assert store.get("status/n1.json").value == b"c"
    assert store._preferred == 0 and store._tokens[first] not in (None, token)


def _each_one_line(tmp_path, capsys, cases) -> list[str]:
    """`node list` under each case's settings: a non-zero exit, nothing on stdout, one
    error line matching the case's message. The lines, for more checks."""
    lines = []
    for settings, message in cases:
        code, out, err = _cli(tmp_path, capsys, settings, "node", "list")
        assert code != 0 and out == "" and err.count("\n") == 1, (settings, err)
        assert re.search(f"^provisiond: error: .*{message}", err), err
        lines.append(err)
    return lines
