"""What an HTTP worker keeps per node or per file stays bounded however many nodes boot."""

import gc
import weakref

from bootdata import add_image, add_nodes, mac_of
from provisiond.api import create_app
from provisiond.api.services import ETAGS_KEPT
from provisiond.boot.artifacts import LruCache, ManifestCache
from provisiond.boot.ipxe import ScriptCache
from provisiond.boot.table import build_table


def test_lru_cache_drops_the_least_recently_used():
    cache = LruCache(3)
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.get("a") == "A"  # now the most recent
    cache.put("d", "D")
    assert len(cache) == 3 and cache.get("b") is None
    assert [cache.get(k) for k in "acd"] == ["A", "C", "D"]


def test_script_cache_is_bounded_and_lets_old_tables_go(config):
    add_nodes(config, 40)
    add_image(config, "tiny")
    scripts = ScriptCache(config, ManifestCache(config), size=16)
    table = build_table(config)
    for i in range(1, 41):
        text = scripts.script(table, table.by_mac[mac_of(i)])
        assert f"provisiond.node=n{i} " in text
    assert len(scripts._scripts) == 16
    old = weakref.ref(table)
    table = build_table(config)  # the inventory changed: a new table
    assert f"provisiond.node=n3 " in scripts.script(table, table.by_mac[mac_of(3)])
    gc.collect()
    assert old() is None, "a cached script keeps a replaced boot table (every node) alive"


def test_manifest_cache_is_bounded(config):
    for i in range(12):
        add_image(config, f"img{i}")
    manifests = ManifestCache(config, size=5)
    assert [manifests.get(f"img{i}")["name"] for i in range(12)] == [f"img{i}" for i in
                                                                      range(12)]
    assert len(manifests._cache) == 5


def test_overlay_etags_are_kept_for_a_bounded_number_of_files(config, tmp_path):
    svc = create_app(config).extensions["provisiond"]
    for i in range(ETAGS_KEPT + 50):
        path = tmp_path / f"o{i}"
        path.write_bytes(b"%d" % i)
        svc.file_etag(path)
    assert len(svc._etags) == ETAGS_KEPT


def test_overlay_files_reuse_one_builder_within_the_interval(config, monkeypatch):
    """A Builder per request walked every overlay's sources each time (4.7 ms a request)."""
    import provisiond.boot.artifacts as artifacts
    from provisiond.inventory import InventoryStore
    from provisiond.overlays import ensure_overlay

    add_nodes(config, 3)
    add_image(config, "tiny")
    with InventoryStore(config).edit() as inv:
        for name in ("n1", "n2", "n3"):
            inv.nodes[name].system_overlays = ["hostname", "hosts"]
    made = []
    real = artifacts.Builder
    monkeypatch.setattr(artifacts, "Builder",
                        lambda *args, **kw: made.append(args) or real(*args, **kw))
    files = artifacts.OverlayFiles(config, interval=3600)
    paths = [files.path(f"n{i}", kind) for i in (1, 2, 3) for kind in ("shared", "system")]
    assert len(made) == 1
    assert paths[:2] == [ensure_overlay(config, "n1", "shared"),
                         ensure_overlay(config, "n1", "system")]
    assert paths[5] == ensure_overlay(config, "n3", "system") != paths[3]
    files.interval = 0  # the interval over: a new Builder sees what changed
    files.path("n1", "system")
    assert len(made) == 2
