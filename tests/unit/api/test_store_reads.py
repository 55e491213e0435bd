"""What one boot costs the store when its reads are requests (etcd): the HTTP app answers
scripts, blobs, overlays, credential and API token checks from the copy its watch keeps
(provisiond.state.watched), and changes made elsewhere (a revocation by the CLI, a new image,
an inventory edit) still reach it through the watch. Here the store is the dict-backed one,
taken for remote, counting its reads."""

from __future__ import annotations

import json
import re
import time

import pytest

from bootdata import add_image, add_nodes, credential, ip_of, mac_of, node_env
from provisiond.api import create_app
from provisiond.auth import Role, TokenStore
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import NetDev, Record
from provisiond.state import open as opening
from provisiond.trust import revoke
from tests.memstore import RemoteMemoryStore

HOT_KEYS = ("inventory.yaml", "images/tiny/manifest.json", "secrets/token.key",
            "secrets/nodes/n1.json", "tokens.json")
"""What a boot, its agent and an API client made each request read before."""


@pytest.fixture
def remote(monkeypatch):
    shared = RemoteMemoryStore()
    monkeypatch.setattr(opening, "open_store", lambda config: shared)
    yield shared
    shared.watch_error = None
    shared.watch_released.set()


@pytest.fixture
def client(config, remote):
    add_nodes(config, 3)
    with InventoryStore(config).edit() as inv:
        for node in inv.nodes.values():
            node.system_overlays, node.runtime_overlays = ["hostname"], ["hosts"]
    publish_image(config, remote)
    return create_app(config).test_client()


def publish_image(config, remote, **changes) -> None:
    manifest = {**add_image(config, "tiny"), **changes}
    remote.put("images/tiny/manifest.json", json.dumps(manifest).encode())


def boot(client, index: int) -> str:
    """What iPXE fetches for node n<index>, from its address; its script."""
    env = node_env(index)
    assert client.get("/boot/ipxe", environ_base=env).status_code == 200
    script = client.get(f"/boot/ipxe/{mac_of(index)}", environ_base=env).get_data(as_text=True)
    paths = re.findall(r"http://[^/ ]+(/(?:blobs|overlays)/\S+)", script)
    assert len(paths) == 5, script  # kernel, two layers, shared and system overlays
    for path in paths:
        response = client.get(path, environ_base=env)
        assert response.status_code == 200, (path, response.data[:300])
    return script


def agent(client, auth: dict, api: dict) -> None:
    """The node's agent (its runtime overlay, a status report) and an API client."""
    env = node_env(1)
    assert client.get("/overlays/n1/runtime", environ_base=env, headers=auth).status_code == 200
    assert client.post("/api/v1/status/n1", data={"phase": "booted"}, environ_base=env,
                       headers=auth).status_code == 200
    assert client.get("/api/v1/jobs", headers=api).status_code == 200


def within(seconds: float, check) -> float:
    """Seconds until check() holds (a bounded wait)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "not within the bound"
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_boot_its_agent_and_an_api_client_read_nothing_per_request(client, config, remote):
    token, _ = TokenStore(config).create("reader", Role.READER)
    api = {"Authorization": f"Bearer {token}"}
    boot(client, 1)
    auth = credential(client, 1)  # the exchange: a write, read and written on the store
    within(5, lambda: all(remote.reads[key] for key in HOT_KEYS))
    time.sleep(0.5)  # the copy's watch has handed the new credential over
    agent(client, auth, api)
    before = {key: remote.reads[key] for key in HOT_KEYS}
    for _ in range(3):
        for index in (1, 2, 3):
            boot(client, index)
        agent(client, auth, api)
    assert {key: remote.reads[key] - before[key] for key in HOT_KEYS} == dict.fromkeys(
        HOT_KEYS, 0)


def test_changes_made_elsewhere_reach_the_app_through_the_watch(client, config, remote):
    boot(client, 1)
    auth = credential(client, 1)
    agent_env = {"environ_base": node_env(1), "headers": auth}
    assert client.get("/overlays/n1/runtime", **agent_env).status_code == 200
    revoke(config, ["n1"])  # as `provisiond node revoke n1` does, from another process
    refused = within(1.0, lambda: client.get("/overlays/n1/runtime", **agent_env
                                             ).status_code == 401)
    assert refused < 1.0
    with InventoryStore(config).edit() as inv:
        inv.nodes["n2"].kernel_args = ["pv.mark=edited"]
    within(1.0, lambda: "pv.mark=edited" in client.get(f"/boot/ipxe/{mac_of(2)}").get_data(
        as_text=True))
    publish_image(config, remote, kernel_args=["console=ttyS1"])
    within(1.0, lambda: "console=ttyS1" in client.get(f"/boot/ipxe/{mac_of(3)}").get_data(
        as_text=True))


def test_a_credential_just_issued_is_accepted_before_the_watch_hands_it_over(client, remote):
    """The copy of the worker that checks it may not hold it yet (the exchange went to the
    other worker, or its watch is slow): the store decides before anything is refused."""
    boot(client, 1)
    remote.watch_released.clear()  # no change reaches the copy from now on
    time.sleep(0.3)
    auth = credential(client, 1)
    env = node_env(1)
    assert client.get("/overlays/n1/runtime", environ_base=env, headers=auth).status_code == 200
    assert client.get("/overlays/n1/runtime", environ_base=env,
                      headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_with_the_watch_broken_a_revoked_credential_is_refused_within_max_age(
        client, config, remote):
    from provisiond.errors import Unavailable
    from provisiond.state.watched import MAX_AGE

    boot(client, 1)
    auth = credential(client, 1)
    agent_env = {"environ_base": node_env(1), "headers": auth}
    time.sleep(0.5)
    assert client.get("/overlays/n1/runtime", **agent_env).status_code == 200
    remote.watch_error = Unavailable("etcd: no member served the request")
    time.sleep(1.5)  # the loop's call in progress ends, the next ones fail
    revoke(config, ["n1"])
    assert within(MAX_AGE + 1.0, lambda: client.get("/overlays/n1/runtime", **agent_env
                                                    ).status_code == 401) <= MAX_AGE + 1.0


def test_the_nodes_address_is_still_checked(client):
    boot(client, 1)
    auth = credential(client, 1)
    response = client.get("/overlays/n1/runtime", environ_base={"REMOTE_ADDR": ip_of(2)},
                          headers=auth)
    assert response.status_code == 403


def test_overlays_follow_the_inventory_on_a_store_that_is_not_files(config, store):
    """A worker's overlays came from take_snapshot, which watched inventory.yaml's stat: on
    etcd that file is not the inventory, and a node added after the worker's first overlay
    request had none (404) until a restart. They follow the boot table now."""
    def node(index: int) -> Record:
        dev = NetDev(mac=mac_of(index), ipaddr=ip_of(index), netmask="255.255.0.0")
        return Record(image="tiny", system_overlays=["hostname", "hosts"], netdevs={"eth0": dev})

    with InventoryStore(config).edit() as inv:
        inv.nodes.update(n1=node(1), n2=node(2))
    client = create_app(config).test_client()
    first = [client.get(f"/overlays/n1/{kind}").data for kind in ("shared", "system")]
    assert client.get("/overlays/n3/system").status_code == 404
    with InventoryStore(config).edit() as inv:
        inv.nodes["n3"] = node(3)
    within(5, lambda: client.get("/overlays/n3/system").status_code == 200)
    now = [client.get(f"/overlays/n1/{kind}").data for kind in ("shared", "system")]
    assert now != first  # its /etc/hosts names n3


def test_a_storms_first_scripts_make_one_signing_key(client, remote, monkeypatch):
    """Scripts asked at once before any key exists: each found none and made one (a put
    with its receipt and lease on etcd: 37 of them in a 300-node storm), all but one
    refused."""
    import threading

    puts = []
    real_get, real_put = remote.get, remote.put

    def slow_get(key):
        time.sleep(0.02)  # a round trip: the others ask meanwhile
        return real_get(key)

    def counted_put(key, value, expect=None):
        puts.append(key)
        return real_put(key, value, expect)

    monkeypatch.setattr(remote, "get", slow_get)
    monkeypatch.setattr(remote, "put", counted_put)
    app = client.application
    scripts = []
    threads = [threading.Thread(target=lambda i=i: scripts.append(app.test_client().get(
        f"/boot/ipxe/{mac_of(i % 3 + 1)}").status_code)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert scripts == [200] * 20
    assert puts.count("secrets/token.key") == 1
