"""Provisioning tokens and node credentials through the HTTP app (Flask's test client, real
files): one exchange per token, every refusal an event and a status entry, the runtime
overlay and status reports only with the node's current credential."""

from __future__ import annotations

import socket
import threading

import pytest

from bootdata import (add_image, add_nodes, add_overlay, credential, exchange, ip_of, mac_of,
                      node_env, token_in)
from provisiond.api import create_app
from provisiond.events import read_since
from provisiond.inventory import InventoryStore, load_nodes
from provisiond.inventory.model import NetDev, Record
from provisiond.lifecycle import forget_nodes
from provisiond.status import read_status
from provisiond.trust import revoke, tokens


@pytest.fixture
def app(config, monkeypatch):
    import provisiond.boot.artifacts as artifacts

    add_nodes(config, 3)
    add_image(config, "tiny")
    runtime = add_overlay(config, "n1", "runtime", b"runtime-cpio")
    monkeypatch.setattr(artifacts.OverlayFiles, "path", lambda self, n, k: runtime)
    app = create_app(config)
    app.extensions["provisiond"].watcher.interval = 0
    return app


@pytest.fixture
def client(app):
    return app.test_client()


def script_token(client, index: int = 1) -> str:
    return token_in(client.get(f"/boot/ipxe/{mac_of(index)}").get_data(as_text=True))


def refusals(config) -> list[tuple]:
    return [(e.subject, e.data["reason"], e.data["address"])
            for e in read_since(config, 0) if e.kind == "token.refused"]


def runtime(client, headers: dict, index: int = 1, **env):
    return client.get("/overlays/n1/runtime", environ_base=node_env(index, **env),
                      headers=headers)


def message(response) -> str:
    """The message of an error answer ({"error": {"code", "message", "field"}})."""
    return response.json["error"]["message"]


def bearer(response) -> dict:
    assert response.status_code == 200, response.json
    assert response.headers["Cache-Control"] == "no-store"
    return {"Authorization": f"Bearer {response.get_data(as_text=True).strip()}"}


def test_a_script_carrying_a_token_is_stored_by_no_cache(client):
    """A cache in front of the server (blobs may have one) must not hand one boot's token to
    the next: the second would be refused as used."""
    first = client.get(f"/boot/ipxe/{mac_of(1)}")
    assert first.headers.get("Cache-Control") == "no-store"
    assert token_in(first.get_data(as_text=True)) != script_token(client)


def test_a_token_is_exchanged_once_a_second_use_is_refused_as_an_event(client, config):
    token = script_token(client)
    auth = bearer(exchange(client, 1, token))
    assert runtime(client, auth).data == b"runtime-cpio"
    again = exchange(client, 1, token)
    assert again.status_code == 401 and "used already" in message(again)
    assert again.headers["WWW-Authenticate"].startswith("Bearer")
    assert refusals(config) == [("n1", "reused", ip_of(1))]
    assert read_status(config, "n1")["token_refused"]["reason"] == "reused"
    assert runtime(client, auth).status_code == 200  # a refused reuse ends nothing


def test_a_token_from_another_address_is_refused_and_stays_usable_by_the_node(client, config):
    token = script_token(client)
    stranger = exchange(client, 1, token, address="10.200.0.7")
    assert stranger.status_code == 401 and "not reserved for the node" in message(stranger)
    neighbour = exchange(client, 1, token, address=ip_of(2))  # another node's address
    assert neighbour.status_code == 401
    assert refusals(config) == [("n1", "wrong_address", "10.200.0.7"),
                                ("n1", "wrong_address", ip_of(2))]
    bearer(exchange(client, 1, token))  # refusals did not use it up


def test_only_a_privileged_source_port_may_exchange(client, config, app):
    """An unprivileged user on the node can fetch a new script (anyone can) but cannot bind
    a port below 1024: that token is refused to them."""
    token = script_token(client)
    for port in (1024, 40000):
        response = exchange(client, 1, token, port=port)
        assert response.status_code == 401 and "below 1024" in message(response)
    assert client.post("/api/v1/credentials/n1", data={"token": token},
                       environ_base={"REMOTE_ADDR": ip_of(1)}).status_code == 401  # no port
    assert [r[1] for r in refusals(config)] == ["unprivileged_port"] * 3
    config.trust.privileged_port = False
    bearer(exchange(client, 1, token, port=40000))


def test_a_late_token_is_refused_as_expired(client, config):
    node = load_nodes(config)["n1"]
    old = tokens.now_ms() - int(config.trust.token_minutes * 60_000) - 1000
    late = tokens.mint(tokens.load_key(config), tokens.binding_for(node, mac_of(1)), old)
    response = exchange(client, 1, late)
    assert response.status_code == 401 and "expired" in message(response)
    assert refusals(config) == [("n1", "expired", ip_of(1))]


def test_forged_and_foreign_tokens_are_invalid(client, config):
    token = script_token(client, 2)  # n2's token, sent as n1 from n1's address
    assert client.post("/api/v1/credentials/n1", data={"token": token},
                       environ_base=node_env(1)).status_code == 401
    mine = script_token(client, 1)
    for bad in (mine[:-1] + ("A" if mine[-1] != "A" else "B"), "junk", "", "x" * 10000):
        assert exchange(client, 1, bad).status_code == 401
    assert client.post("/api/v1/credentials/n1", json={"token": mine},
                       environ_base=node_env(1)).status_code == 200
    assert {r[1] for r in refusals(config)} == {"invalid"}
    assert client.post("/api/v1/credentials/n1", data="[1]", content_type="application/json",
                       environ_base=node_env(1)).status_code == 400
    assert client.post("/api/v1/credentials/zz", data={"token": mine}).status_code == 404


def test_a_token_minted_before_a_node_moved_is_invalid(client, config):
    token = script_token(client)
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].netdevs["eth0"].ipaddr = "10.99.9.9"
    response = exchange(client, 1, token, address="10.99.9.9")
    assert response.status_code == 401 and refusals(config)[0][1] == "invalid"
    bearer(exchange(client, 1, address="10.99.9.9"))


def test_a_token_for_a_mac_the_node_no_longer_has_is_invalid(client, config):
    token = script_token(client)
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].netdevs["eth0"].mac = "52:54:00:aa:bb:cc"  # a new NIC, same address
    response = exchange(client, 1, token)
    assert response.status_code == 401 and refusals(config)[0][1] == "invalid"


def test_a_token_key_made_anew_signs_the_next_scripts(client, config):
    """A damaged token.key is to be deleted to make a new one (load_key says so), and an
    admin may replace a leaked one: the running server's next scripts carry tokens of the
    key on disk, which the exchange verifies. Held in memory, the old key signed tokens
    that every exchange refused as invalid until a restart."""
    old = script_token(client)  # the key is in use
    tokens.key_path(config).unlink()
    bearer(exchange(client, 1, script_token(client)))
    assert exchange(client, 1, old).status_code == 401  # the old key's tokens end
    replaced = tokens.key_path(config)
    replaced.unlink()
    replaced.write_bytes(b"k" * tokens.KEY_BYTES)
    replaced.chmod(0o600)
    bearer(exchange(client, 2, script_token(client, 2)))


def test_a_later_exchange_ends_the_credential_and_supersedes_older_tokens(client, config):
    first, second = script_token(client), script_token(client)  # iPXE asked twice
    old = bearer(exchange(client, 1, first))
    new = bearer(exchange(client, 1, script_token(client)))
    assert runtime(client, old).status_code == 401
    assert runtime(client, new).status_code == 200
    response = exchange(client, 1, second)
    assert response.status_code == 401 and refusals(config)[-1][1] == "superseded"


def test_revoke_ends_the_credential_and_every_token_minted_so_far(client, config):
    pending = script_token(client)
    auth = bearer(exchange(client, 1))
    assert revoke(config, ["n1"]) == ["n1"]
    assert runtime(client, auth).status_code == 401
    assert exchange(client, 1, pending).status_code == 401
    assert refusals(config)[-1][1] == "superseded"
    assert runtime(client, bearer(exchange(client, 1))).status_code == 200  # a new boot


def test_a_deleted_node_leaves_no_credential_to_a_new_node_of_its_name(client, config):
    auth = bearer(exchange(client, 1))
    forget_nodes(config, ["n1"])
    assert not (config.trust_dir / "n1.json").exists()
    assert runtime(client, auth).status_code == 401


def test_runtime_overlay_needs_the_credential_from_the_nodes_address(client, config):
    auth = bearer(exchange(client, 1))
    assert runtime(client, {}).status_code == 401
    assert runtime(client, {"Authorization": "Bearer wrong"}).status_code == 401
    assert runtime(client, {"Authorization": auth["Authorization"][7:]}).status_code == 401
    assert runtime(client, auth, 2).status_code == 403
    other = credential(client, 2)  # n2's own credential opens n2's overlay, not n1's
    assert runtime(client, other, 2).status_code == 401


def test_status_reports_need_the_credential_and_never_the_servers_own_phases(client, config):
    before = read_status(config, "n1")
    forged = client.post("/api/v1/status/n1", data={"phase": "ready"},
                         environ_base=node_env(1))
    assert forged.status_code == 401 and read_status(config, "n1") == before
    auth = credential(client, 1)
    client.application.extensions["provisiond"].phases.flush()
    for phase in ("dhcp", "ipxe", "kernel"):
        response = client.post("/api/v1/status/n1", data={"phase": phase},
                               environ_base=node_env(1), headers=auth)
        assert response.status_code == 400 and "recorded by the server" in message(response)
    assert read_status(config, "n1")["phase"] == "ipxe"
    assert client.post("/api/v1/status/n1", data={"phase": "ready"}, environ_base=node_env(1),
                       headers=auth).json["phase"] == "ready"


def test_an_ipv6_only_node_gets_its_runtime_overlay(config, monkeypatch):
    import provisiond.boot.artifacts as artifacts

    add_image(config, "tiny")
    with InventoryStore(config).edit() as inv:
        inv.nodes["v6"] = Record(image="tiny", netdevs={"eth0": NetDev(
            mac="52:54:00:66:00:01", ipaddr6="fd00::66")})
    runtime_file = add_overlay(config, "v6", "runtime", b"v6-runtime")
    monkeypatch.setattr(artifacts.OverlayFiles, "path", lambda self, n, k: runtime_file)
    client = create_app(config).test_client()
    token = token_in(client.get("/boot/ipxe/52:54:00:66:00:01").get_data(as_text=True))
    env = {"REMOTE_ADDR": "fd00::66", "REMOTE_PORT": "700"}
    auth = bearer(client.post("/api/v1/credentials/v6", data={"token": token},
                              environ_base=env))
    assert client.get("/overlays/v6/runtime", environ_base=env,
                      headers=auth).data == b"v6-runtime"
    manifest = add_image(config, "tiny")
    client.get(f"/blobs/sha256/{manifest['kernel']['digest'][7:]}", environ_base=env)
    client.application.extensions["provisiond"].phases.flush()
    assert read_status(config, "v6")["phase"] == "kernel"  # the server sees it over IPv6


def test_a_flood_of_bad_tokens_is_a_few_events_not_one_per_request(client, config):
    for _ in range(50):
        assert exchange(client, 1, "junk").status_code == 401
    assert 1 <= len(refusals(config)) <= 5


class Listener:
    """The agent's side of a callback: root listening on a port below 1024 of the node's
    address, saying `key` first, then keeping what it is sent."""

    def __init__(self, key: bytes):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for port in range(700, 1024):
            try:
                self.sock.bind(("127.0.0.2", port))
                break
            except OSError:
                continue
        self.port = self.sock.getsockname()[1]
        self.sock.listen(1)
        self.key = key
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(30)
        conn, _ = self.sock.accept()
        with conn:
            conn.sendall(self.key + b"\n")
            conn.settimeout(30)
            while chunk := conn.recv(200):
                self.received += chunk
        self.sock.close()


@pytest.fixture
def loopback_node(config, client):
    with InventoryStore(config).edit() as inv:
        inv.nodes["lo1"] = Record(image="tiny", netdevs={"eth0": NetDev(
            mac="52:54:00:10:00:01", ipaddr="127.0.0.2")})
    token = lambda: token_in(client.get("/boot/ipxe/52:54:00:10:00:01").get_data(  # noqa
        as_text=True))
    return token


def callback_exchange(client, token: str, port: int, key: str = "k" * 20):
    return client.post("/api/v1/credentials/lo1", environ_base={
        "REMOTE_ADDR": "127.0.0.2", "REMOTE_PORT": "40000"}, data={
        "token": token, "callback": str(port), "callback_key": key})


def test_a_callback_to_a_privileged_port_delivers_the_credential(client, config,
                                                                 loopback_node):
    """busybox nc cannot choose its source port but can listen on one below 1024: the
    credential goes to that listener, never into the answer."""
    listener = Listener(b"k" * 20)
    response = callback_exchange(client, loopback_node(), listener.port)
    assert response.status_code == 200 and response.get_data(as_text=True) == "delivered\n"
    listener.thread.join(30)
    credential = listener.received.decode().strip()
    assert len(credential) >= 40 and credential not in response.get_data(as_text=True)
    answer = client.get("/overlays/lo1/runtime", environ_base={"REMOTE_ADDR": "127.0.0.2"},
                        headers={"Authorization": f"Bearer {credential}"})
    assert answer.status_code == 200


def test_a_callback_listener_that_does_not_say_the_key_gets_nothing(client, config,
                                                                     loopback_node,
                                                                     monkeypatch):
    """Another root service on the node (here: one saying something else) is handed no
    credential, and the token stays usable; an unprivileged port is refused outright."""
    from provisiond.api.v1 import credentials

    monkeypatch.setattr(credentials, "CALLBACK_SECONDS", 1.0)
    token = loopback_node()
    other = Listener(b"SSH-2.0-OpenSSH_9.2")
    response = callback_exchange(client, token, other.port)
    assert response.status_code == 400 and "did not say the callback key" in \
        message(response)
    other.thread.join(30)
    assert other.received == b""
    nobody = callback_exchange(client, token, other.port)  # nothing listens any more
    assert nobody.status_code == 400 and "cannot deliver" in message(nobody)
    high = callback_exchange(client, token, 40000)
    assert high.status_code == 401 and refusals(config)[-1][1] == "unprivileged_port"
    assert callback_exchange(client, token, 700, key="short").status_code == 400
    good = Listener(b"k" * 20)
    assert callback_exchange(client, token, good.port).status_code == 200


class Trickle(Listener):
    """A listener that says its key one byte every 10 ms and never ends the line: the
    server must give up at its deadline, not read on (0.1 s a byte allowed) to 130."""

    def _serve(self):
        self.sock.settimeout(30)
        conn, _ = self.sock.accept()
        self.sent = 0
        with conn:
            try:
                while self.sent < 200:
                    conn.sendall(b"k")
                    self.sent += 1
                    threading.Event().wait(0.01)
            except OSError:
                pass
        self.sock.close()


def test_a_callback_listener_is_given_up_at_the_deadline(client, config, loopback_node,
                                                         monkeypatch):
    from provisiond.api.v1 import credentials

    monkeypatch.setattr(credentials, "CALLBACK_SECONDS", 0.3)
    slow = Trickle(b"")
    response = callback_exchange(client, loopback_node(), slow.port)
    slow.thread.join(30)
    assert response.status_code == 400 and "timed out" in message(response)
    assert slow.sent < 100  # the server hung up at 0.3 s, some 30 bytes in
