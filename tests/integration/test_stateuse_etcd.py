"""The shared documents on a real 3-member etcd cluster: two servers' state dirs name the
same cluster; what one writes (the CLI, a store object) the other sees through its watch:
a running serve's boot table, events, node status; concurrent inventory edits through two
stores lose none; files -> etcd -> files with `state export|import` is exact."""

from __future__ import annotations

import shutil
import threading
import time
import uuid

import pytest

from provisiond import events, status
from provisiond.cli import main
from provisiond.config import load_config, write_default_config
from provisiond.inventory import InventoryStore
from provisiond.state import open as opening
from provisiond.state.crypt import create_key
from provisiond.state.etcd import EtcdStore
from provisiond.states import NodePhase
from tests.etcd_cluster import ETCD, cluster_fixture
from tests.integration.boot.servers import (loopback_services, start_serve, stop_serve,
                                            write_config)
from tests.tools import command
from tests.unit.cli.test_state_cli import _records, _site, _values
from tests.unit.inventory.test_inventory_cas import add_at_once

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ETCD.is_file(), reason="needs Debian's etcd-server")]


cluster = cluster_fixture()


@pytest.fixture
def url(cluster):
    """A key root of its own for each test."""
    return cluster.url(f"/t-{uuid.uuid4().hex[:8]}")


def _server(state, url, key_from=None):
    """A state dir whose store is the cluster (store.key copied from the first server)."""
    if not (state / "provisiond.yaml").exists():
        write_default_config(state)
    write_config(state, store=url)
    if key_from is not None:
        shutil.copy2(key_from / "store.key", state / "store.key")
    elif not (state / "store.key").exists():
        create_key(state / "store.key")
    return load_config(state)


def _cli(state, *args):
    code = main(["--state-dir", str(state), *args])
    assert code == 0, args


def _dig(port, name):
    import subprocess

    return subprocess.run(command(["dig", "+short", "+time=2", "+tries=1", "-p", str(port),
                                   "@127.0.0.1", name]),
                          capture_output=True, text=True, timeout=30).stdout.split()


def _until(check, seconds=60.0, pause=0.2):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(pause)
    return False


def test_a_running_serve_picks_up_a_cli_node_set_made_elsewhere(url, tmp_path):
    first = tmp_path / "a"
    _server(first, url)
    _cli(first, "node", "add", "n01", "--mac", "52:54:00:00:00:01", "--ipaddr", "10.99.0.2")
    second = tmp_path / "b"
    ports = loopback_services(second)
    _server(second, url, key_from=first)
    proc = start_serve(second)
    try:
        assert _until(lambda: _dig(ports["dns"], "n01.cluster") == ["10.99.0.2"]), \
            (second / "serve.log").read_text()[-2000:]
        _cli(first, "node", "set", "n01", "--ipaddr", "10.99.0.9")
        assert _until(lambda: _dig(ports["dns"], "n01.cluster") == ["10.99.0.9"], 30), \
            (second / "serve.log").read_text()[-2000:]
    finally:
        assert stop_serve(proc) == 0


def test_concurrent_inventory_edits_through_two_stores_lose_none(url, tmp_path, monkeypatch):
    configs = [_server(tmp_path / "a", url)]
    configs.append(_server(tmp_path / "b", url, key_from=tmp_path / "a"))
    stores = [EtcdStore(url, tmp_path / "a" / "store.key"),
              EtcdStore(url, tmp_path / "b" / "store.key")]
    monkeypatch.setattr(opening, "open_store",
                        lambda config: stores[configs.index(config)])
    errors = add_at_once(lambda index: configs[index % 2], timeout=300)
    assert not errors
    for config in configs:
        stored = InventoryStore(config).read()
        assert sorted(stored.nodes) == sorted(f"t{i}" for i in range(20))
        assert stored.revision == 20


def test_events_and_status_written_by_one_server_reach_the_other(url, tmp_path):
    first = _server(tmp_path / "a", url)
    second = _server(tmp_path / "b", url, key_from=tmp_path / "a")
    after = events.latest_id(second)
    found = []
    waiter = threading.Thread(target=lambda: found.append(events.wait(second, after, 30)))
    waiter.start()
    status.record_phase(first, "n1", NodePhase.DHCP)
    waiter.join(60)
    assert found == [True]
    assert [(e.kind, e.subject) for e in events.read_since(second, after)] == [
        ("node.phase", "n1")]
    assert status.read_all_status(second)["n1"]["phase"] == "dhcp"
    assert not (tmp_path / "a" / "events").exists()  # on the store, not in a local file


def test_files_to_etcd_to_files_is_exact(url, tmp_path, capsys):
    source, middle, back = tmp_path / "files", tmp_path / "etcd", tmp_path / "files2"
    _site(source, capsys)
    _server(middle, url)
    _cli(source, "state", "export", str(tmp_path / "one.json"))
    _cli(middle, "state", "import", str(tmp_path / "one.json"))
    _cli(middle, "state", "export", str(tmp_path / "two.json"))
    write_default_config(back)
    _cli(back, "state", "import", str(tmp_path / "two.json"))
    assert _values(back) == _values(source)
    assert len(_values(source)) >= 5
    # the journals are moved as records: etcd's server reads the files store's audit record
    # and events (their JSON-lines files were copied as keys no journal of etcd read)
    assert _records(middle) == _records(back) == _records(source)
    assert len(_records(source)["audit"]) >= 3
