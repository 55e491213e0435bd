"""Provisioning tokens and the credential store, as a library (no HTTP)."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from provisiond.errors import ProvisiondError
from provisiond.inventory import InventoryStore, load_nodes
from provisiond.inventory.model import NetDev, Record
from provisiond.trust import ProvisioningTokenRefused, Refusal, exchange, revoke, tokens
from provisiond.trust.credentials import authenticate

MAC = "52:54:00:00:00:01"


@pytest.fixture
def node(config):
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"] = Record(netdevs={"eth0": NetDev(mac=MAC, ipaddr="10.0.0.1",
                                                          ipaddr6="fd00::1")})
        inv.nodes["n2"] = Record(netdevs={"eth0": NetDev(mac="52:54:00:00:00:02",
                                                          ipaddr="10.0.0.2")})
    return load_nodes(config)["n1"]


def test_a_token_verifies_only_for_its_node_mac_and_addresses(config, node):
    key = tokens.load_key(config)
    text = tokens.mint(key, tokens.binding_for(node, MAC))
    token = tokens.parse(text)
    assert token.mac == MAC and tokens.verify(key, token, tokens.binding_for(node, MAC))
    other = tokens.Binding("n2", MAC, tuple(node.addresses))
    moved = tokens.Binding("n1", MAC, ("10.0.0.9", "fd00::1"))
    assert not tokens.verify(key, token, other)
    assert not tokens.verify(key, token, moved)
    assert not tokens.verify(os.urandom(32), token, tokens.binding_for(node, MAC))
    forged = tokens.parse(text[:-2] + ("AA" if not text.endswith("AA") else "BB"))
    assert not tokens.verify(key, forged, tokens.binding_for(node, MAC))
    for junk in ("", "1.", text + "x", text.replace(".", ",", 1), "x" * 500):
        assert tokens.parse(junk) is None


def test_the_signing_key_is_made_once_0600_and_shared(config):
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(tokens.load_key(config)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(keys) == 8 and len(set(keys)) == 1
    path = tokens.key_path(config)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["token.key"]  # no temp file left
    path.write_bytes(b"short")
    with pytest.raises(ProvisiondError, match="not a token key"):
        tokens.load_key(config)


def test_credentials_are_stored_hashed_0600_and_the_token_is_used_once(config, node):
    text = tokens.mint(tokens.load_key(config), tokens.binding_for(node, MAC))
    credential = exchange(config, node, text, "fd00::1", 700)
    stored = config.trust_dir / "n1.json"
    assert credential not in stored.read_text() and text not in stored.read_text()
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.trust_dir.stat().st_mode) == 0o700
    authenticate(config, node, f"Bearer {credential}", "10.0.0.1")
    with pytest.raises(ProvisioningTokenRefused) as refused:
        exchange(config, node, text, "10.0.0.1", 700)
    assert refused.value.reason is Refusal.REUSED
    assert revoke(config, ["n1", "n2"]) == ["n1"]
    with pytest.raises(ProvisiondError, match="not the node's current credential"):
        authenticate(config, node, f"Bearer {credential}", "10.0.0.1")


def test_one_token_sent_at_once_by_many_gives_one_credential(config, node):
    """Two exchanges of one token racing (both past the first check, both delivering a
    credential by callback at the same time): one wins, the other is `reused`, and only
    the winner's credential opens anything."""
    text = tokens.mint(tokens.load_key(config), tokens.binding_for(node, MAC))
    both_delivering = threading.Barrier(2, timeout=30)
    delivered: list[str] = []
    results: list = []

    def deliver(credential: str) -> None:
        delivered.append(credential)
        both_delivering.wait()

    def attempt() -> None:
        try:
            results.append(exchange(config, node, text, "10.0.0.1", 700, deliver))
        except ProvisioningTokenRefused as refused:
            results.append(refused.reason)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [r for r in results if not isinstance(r, Refusal)]
    assert len(delivered) == 2 and len(winners) == 1 and Refusal.REUSED in results
    authenticate(config, node, f"Bearer {winners[0]}", "10.0.0.1")
    loser = next(c for c in delivered if c != winners[0])
    with pytest.raises(ProvisiondError, match="not the node's current credential"):
        authenticate(config, node, f"Bearer {loser}", "10.0.0.1")


def test_with_the_store_away_the_scripts_waiting_for_the_key_fail_together(config, store,
                                                                          monkeypatch):
    """No key in the server's copy, and the store away when it is loaded: the scripts that
    waited for the one load under way each tried in turn after it failed, the 10th after
    10 times the store's wait."""
    import threading
    import time

    from provisiond.errors import Unavailable

    class NoKey:  # a server's copy that holds no key (none was made yet)
        def get(self, key):
            return None

    def away(*args, **kwargs):
        time.sleep(0.3)
        raise Unavailable("etcd: no member served the request")

    monkeypatch.setattr(store, "get", away)
    signing = tokens.SigningKey(config, NoKey())
    start, failed = threading.Barrier(10), []

    def script() -> None:
        start.wait(30)
        began = time.monotonic()
        with pytest.raises(Unavailable):
            signing.get()
        failed.append(time.monotonic() - began)

    threads = [threading.Thread(target=script) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(failed) == 10 and max(failed) < 1.5, sorted(failed)
