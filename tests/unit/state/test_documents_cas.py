"""secrets.yaml, tokens.json, node credentials and the token key written by compare-and-swap:
writers through two stores on one state dir lose nothing, and the files stay as before."""

from __future__ import annotations

import stat
import threading

from provisiond.auth import Role, TokenStore
from provisiond.inventory.secrets import SecretStore
from provisiond.state import open as opening
from provisiond.state.files import FilesStore
from provisiond.trust import tokens


def _in_threads(config, monkeypatch, work, count=20):
    """work(i) in `count` threads, alternating between two store objects."""
    stores = [FilesStore(config.state_dir), FilesStore(config.state_dir)]
    turn = threading.local()
    monkeypatch.setattr(opening, "open_store",
                        lambda config: stores[getattr(turn, "index", 0)])
    errors, results = [], {}

    def run(index):
        turn.index = index % 2
        try:
            results[index] = work(index)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    return results


def test_concurrent_token_creations_lose_none(config, monkeypatch):
    _in_threads(config, monkeypatch,
                lambda i: TokenStore(config).create(f"t{i}", Role.READER))
    assert [r.name for r in TokenStore(config).list()] == sorted(f"t{i}" for i in range(20))
    path = config.state_dir / "tokens.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_concurrent_secret_sets_lose_none(config, monkeypatch):
    _in_threads(config, monkeypatch,
                lambda i: SecretStore(config).set("nodes", [f"n{i}"], "bmc_password", str(i)))
    stored = SecretStore(config).read()["nodes"]
    assert stored == {f"n{i}": {"bmc_password": str(i)} for i in range(20)}
    assert stat.S_IMODE(config.secrets_path.stat().st_mode) == 0o600


def test_servers_making_the_token_key_at_once_agree(config, monkeypatch):
    """Two servers both find no key, both make one: the loser reads the winner's."""
    both_looked = threading.Barrier(2, timeout=30)
    real_get = FilesStore.get

    def get(self, key):
        entry = real_get(self, key)
        if key == "secrets/token.key" and entry is None:
            both_looked.wait()
        return entry

    monkeypatch.setattr(FilesStore, "get", get)
    keys = _in_threads(config, monkeypatch, lambda i: tokens.load_key(config), count=2)
    assert keys[0] == keys[1]
    assert (config.state_dir / "secrets" / "token.key").read_bytes() == keys[0]


def test_a_signing_key_replaced_on_the_store_is_read_again(config, store):
    held = tokens.SigningKey(config)
    first = held.get()
    store.put("secrets/token.key", b"k" * 32)
    assert held.get() == b"k" * 32 != first
