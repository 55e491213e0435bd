"""open_store: the backend a `store:` setting names, one store per process and URL."""

from __future__ import annotations

import os

import pytest

from provisiond.config import Config, load_config
from provisiond.errors import InvalidConfig
from provisiond.state.etcd import EtcdStore
from provisiond.state.files import FilesStore
from provisiond.state.open import open_store, open_url


def test_the_state_dir_is_the_default_store(config):
    store = open_store(config)
    assert isinstance(store, FilesStore) and store.root == config.state_dir
    assert open_store(config) is store


def test_a_store_setting_names_an_etcd_cluster(state_dir):
    (state_dir / "provisiond.yaml").write_text(
        "store: etcd://127.0.0.1:2379,[::1]:2380/site-a\n")
    config = load_config(state_dir)
    store = open_store(config)
    assert isinstance(store, EtcdStore)
    assert [(c.host, c.port) for c in store.clients] == [("127.0.0.1", 2379), ("::1", 2380)]
    assert store.root == b"/site-a/" and store.key_path == state_dir / "store.key"


@pytest.mark.parametrize("setting, message", [
    ("etcd://127.0.0.1", "not host:port"),
    ("http://127.0.0.1:2379", "etcd://HOST:PORT"),
    ("etcd://a:1,a:1", "named twice"),
    ("etcd://a:1/bad root", "key root"),
    ("files:///elsewhere", "etcd://HOST:PORT"),
])
def test_a_bad_store_setting_is_one_line(state_dir, setting, message):
    (state_dir / "provisiond.yaml").write_text(f"store: {setting!r}\n")
    with pytest.raises(InvalidConfig, match=f"provisiond.yaml: store: .*{message}"):
        load_config(state_dir)


def test_a_forked_child_opens_its_own_store(tmp_path):
    config = Config(state_dir=tmp_path, store="etcd://127.0.0.1:2379")
    parent = open_store(config)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a gunicorn worker forked after the master opened the store
        child = open_store(config)
        os.write(write, b"new" if child is not parent and open_store(config) is child else b"same")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.waitpid(pid, 0)
    assert answer == b"new"
    assert open_store(config) is parent


def test_an_unknown_url_scheme_is_refused(tmp_path):
    with pytest.raises(InvalidConfig, match="neither files"):
        open_url("redis://x:1")
