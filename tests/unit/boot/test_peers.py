"""Blob fetch from peers (provisiond.boot.peers) against real HTTP servers on loopback that
answer as a peer would: good copies, other bytes, a body cut short, 404, silence."""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from provisiond.boot import peers as peers_module
from provisiond.boot.peers import PEER_HEADER, BlobUnavailable, local_or_fetched
from provisiond.config import Config
from provisiond.images.blobs import BlobNotFound
from provisiond.images.manifests import save_manifest
from provisiond.state.layout import Layout

DATA = b"layer bytes " * 50_000  # 600 KB: several reads of a chunk


class Peer:
    """A loopback HTTP server answering GET /blobs/sha256/<hex> with `blobs[hex]` (bytes),
    or as `mode` says: "cut" sends half of it under the full Content-Length, "silent"
    never answers (until closed), "flood" sends it again and again without a length,
    "drip" sends a byte every 50 ms (for at most 30 s, each
    within any socket timeout), anything missing is a 404. Counts the requests."""

    def __init__(self, blobs: dict[str, bytes], mode: str = "ok"):
        self.blobs, self.mode, self.requests, self.headers = blobs, mode, 0, []
        self.sent = 0
        self.release = threading.Event()
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                peer.requests += 1
                peer.headers.append(dict(self.headers))
                if peer.mode == "silent":
                    peer.release.wait(30)
                    return
                data = peer.blobs.get(self.path.rsplit("/", 1)[-1])
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                if peer.mode != "flood":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if peer.mode == "drip":
                    self.drip(data)
                    return
                if peer.mode == "flood":
                    self.flood(data)
                    return
                self.wfile.write(data[:len(data) // 2] if peer.mode == "cut" else data)

            def flood(self, data: bytes) -> None:
                """`data` again and again, 64 MiB at most; counts what the client took."""
                while peer.sent < 64 << 20:
                    try:
                        self.wfile.write(data)
                    except OSError:  # the fetch gave up
                        return
                    peer.sent += len(data)

            def drip(self, data: bytes) -> None:
                for byte in data[:600]:  # 30 s at most
                    if peer.release.wait(0.05):
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:  # the fetch gave up
                        return

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def peers():
    started: list[Peer] = []

    def start(blobs, mode="ok") -> Peer:
        started.append(Peer(blobs, mode))
        return started[-1]

    yield start
    for peer in started:
        peer.close()


def with_peers(config: Config, *peers: Peer, **settings) -> Config:
    return config.model_copy(update={"peers": config.peers.model_copy(
        update={"urls": [p.url for p in peers], **settings})})


def hex_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored(config: Config) -> list[str]:
    """Every file in the blob store, temp files included."""
    folder = config.blob_dir
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_missing_blob_is_fetched_checked_and_kept(config, peers):
    peer = peers({hex_of(DATA): DATA})
    config = with_peers(config, peer)
    path = local_or_fetched(config, hex_of(DATA))
    assert path.read_bytes() == DATA and stored(config) == [hex_of(DATA)]
    assert peer.headers[0].get(PEER_HEADER) == "1"  # the peer must not fetch onward
    assert local_or_fetched(config, hex_of(DATA)) == path and peer.requests == 1


def test_a_corrupted_copy_is_refused_and_the_next_peer_gives_a_good_one(config, peers):
    bad = peers({hex_of(DATA): DATA[:-1] + b"X"})
    good = peers({hex_of(DATA): DATA})
    config = with_peers(config, bad, good)
    assert local_or_fetched(config, hex_of(DATA)).read_bytes() == DATA
    assert (bad.requests, good.requests) == (1, 1)
    assert stored(config) == [hex_of(DATA)]


@pytest.mark.parametrize("mode", ["corrupt", "cut"])
def test_no_good_copy_is_an_error_and_leaves_nothing_in_the_store(config, peers, mode):
    data = DATA[:-1] + b"X" if mode == "corrupt" else DATA
    peer = peers({hex_of(DATA): data}, "cut" if mode == "cut" else "ok")
    config = with_peers(config, peer)
    with pytest.raises(BlobUnavailable) as raised:
        local_or_fetched(config, hex_of(DATA))
    assert raised.value.http_status == 502 and peer.url in str(raised.value)
    assert stored(config) == []  # no partial and no wrong blob, no temp file
    assert not (config.blob_dir / hex_of(DATA)).exists()


def test_a_blob_no_peer_has_is_not_found(config, peers):
    config = with_peers(config, peers({}), peers({}))
    with pytest.raises(BlobNotFound):
        local_or_fetched(config, hex_of(DATA))


def test_without_peers_nothing_is_fetched(config):
    path = local_or_fetched(config, hex_of(DATA))
    assert path == config.blob_dir / hex_of(DATA) and not path.exists()


def test_a_silent_peer_is_given_up_after_the_timeout_and_the_next_is_asked(config, peers):
    silent = peers({hex_of(DATA): DATA}, "silent")
    good = peers({hex_of(DATA): DATA})
    config = with_peers(config, silent, good, timeout=0.5)
    assert local_or_fetched(config, hex_of(DATA)).read_bytes() == DATA
    assert silent.requests == 1 and good.requests == 1


def test_a_peer_sending_slowly_is_given_up_after_fetch_seconds(config, peers):
    """Each byte comes within peers.timeout: only the whole fetch's bound ends it. One read
    of a chunk waited for the whole chunk (1 MiB at 20 bytes a second: 14 hours)."""
    dripping = peers({hex_of(DATA): DATA}, "drip")
    config = with_peers(config, dripping, timeout=0.5, fetch_seconds=1)
    done = threading.Event()
    failed: list[Exception] = []

    def fetch():
        try:
            local_or_fetched(config, hex_of(DATA))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            failed.append(exc)
        done.set()

    threading.Thread(target=fetch, daemon=True).start()
    assert done.wait(15), "the fetch went on past peers.fetch_seconds"
    assert isinstance(failed[0], BlobUnavailable) and "fetch_seconds" in str(failed[0])
    assert stored(config) == []


def test_concurrent_requests_for_one_digest_fetch_it_once(config, peers):
    peer = peers({hex_of(DATA): DATA})
    config = with_peers(config, peer)
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: local_or_fetched(config, hex_of(DATA)), range(16)))
    assert all(p.read_bytes() == DATA for p in paths)
    assert peer.requests == 1
    assert stored(config) == [hex_of(DATA)]


def test_a_malformed_digest_is_refused_before_any_fetch(config, peers):
    peer = peers({})
    with pytest.raises(Exception) as raised:
        local_or_fetched(with_peers(config, peer), "../" + "a" * 61)
    assert getattr(raised.value, "http_status", None) == 400 and peer.requests == 0


def test_fetch_lock_files_stay_outside_the_blob_store(config, peers):
    peer = peers({hex_of(DATA): DATA})
    config = with_peers(config, peer)
    local_or_fetched(config, hex_of(DATA))
    assert not list(Layout.of(config).blob_fetch_lock(hex_of(DATA)).parent.iterdir())


@pytest.mark.parametrize("blobs", [{}, {hex_of(DATA): DATA[:-1] + b"X"}])
def test_a_failed_fetch_leaves_no_lock_file(config, peers, blobs):
    """A client asking for made-up digests left one lock file each, for ever."""
    config = with_peers(config, peers(blobs))
    with pytest.raises((BlobNotFound, BlobUnavailable)):
        local_or_fetched(config, hex_of(DATA))
    assert not list(Layout.of(config).blob_fetch_lock(hex_of(DATA)).parent.iterdir())


def test_a_request_waiting_on_a_removed_lock_file_does_not_fetch_beside_a_newer_one(
        config, monkeypatch):
    """A fails and removes the lock file while B waits on it; B then holds a lock on a
    removed file, which C (opening the file there now) would not see."""
    digest = hex_of(DATA)
    config = config.model_copy(update={"peers": config.peers.model_copy(
        update={"urls": ["http://127.0.0.1:9"]})})  # never asked: _fetch is replaced
    inside = {name: threading.Event() for name in "ABC"}
    leave = {name: threading.Event() for name in "ABC"}
    waiting = {name: threading.Event() for name in "ABC"}
    real_flock = fcntl.flock

    def flock(handle, op):
        try:
            return real_flock(handle, op)
        except BlockingIOError:
            waiting[threading.current_thread().name].set()
            raise

    def fetch(config, hexdigest, deadline):
        name = threading.current_thread().name
        inside[name].set()
        assert leave[name].wait(20)
        if name == "A":
            raise BlobUnavailable("A's peers failed")
        config.blob_dir.mkdir(parents=True, exist_ok=True)
        (config.blob_dir / hexdigest).write_bytes(DATA)

    monkeypatch.setattr(peers_module.fcntl, "flock", flock)
    monkeypatch.setattr(peers_module, "_fetch", fetch)
    errors: list[Exception] = []

    def request():
        try:
            local_or_fetched(config, digest)
        except BlobUnavailable as exc:
            errors.append(exc)

    threads = {name: threading.Thread(target=request, name=name, daemon=True)
               for name in "ABC"}
    threads["A"].start()
    assert inside["A"].wait(10)
    threads["B"].start()
    assert waiting["B"].wait(10)
    leave["A"].set()
    assert inside["B"].wait(10)
    threads["C"].start()
    deadline = time.monotonic() + 10
    while not (waiting["C"].is_set() or inside["C"].is_set()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiting["C"].is_set() and not inside["C"].is_set(), "C fetched beside B"
    leave["B"].set()
    leave["C"].set()
    for thread in threads.values():
        thread.join(10)
    assert not inside["C"].is_set() and len(errors) == 1


def test_a_copy_longer_than_its_manifest_says_is_cut_off(config, peers):
    """A peer sending without end (or a huge body) filled the blob store's disk for
    peers.fetch_seconds; now a byte beyond the size the manifests list ends the fetch."""
    save_manifest(config, {"name": "img", "layers": [],
                           "kernel": {"digest": f"sha256:{hex_of(DATA)}", "size": len(DATA)}})
    flooding = peers({hex_of(DATA): DATA}, "flood")
    config = with_peers(config, flooding)
    with pytest.raises(BlobUnavailable, match="more than the 600000 bytes"):
        local_or_fetched(config, hex_of(DATA))
    assert flooding.sent < 16 << 20 and stored(config) == []


def test_peers_are_asked_directly_not_through_the_http_proxy(config, peers, monkeypatch):
    """$http_proxy is set for apt and debootstrap on many sites; the fetch went to it."""
    proxy = peers({})  # answers every request 404, as a proxy outside the network might
    good = peers({hex_of(DATA): DATA})
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's, built from the env
    assert local_or_fetched(with_peers(config, good), hex_of(DATA)).read_bytes() == DATA
    assert (proxy.requests, good.requests) == (0, 1)


def test_a_blob_is_fetched_while_the_store_cannot_be_read(config, peers, monkeypatch):
    """The manifests' size limit is read from the store: with etcd's quorum lost, a node's
    layer a peer has was refused 503 for want of a size."""
    from provisiond.errors import Unavailable

    def store_down(config, digest):
        raise Unavailable("etcd: no member answered")

    monkeypatch.setattr(peers_module, "listed_size", store_down)
    config = with_peers(config, peers({hex_of(DATA): DATA}))
    assert local_or_fetched(config, hex_of(DATA)).read_bytes() == DATA


def test_a_state_dir_that_cannot_hold_the_fetch_lock_is_unavailable(config, peers):
    """A full or read-only state dir: the fetch lock's OSError was an internal error."""
    from provisiond.errors import Unavailable

    Layout.of(config).blob_fetch_lock(hex_of(DATA)).parent.parent.mkdir(parents=True)
    Layout.of(config).blob_fetch_lock(hex_of(DATA)).parent.write_text("not a directory")
    config = with_peers(config, peers({hex_of(DATA): DATA}))
    with pytest.raises(Unavailable, match="cannot take its fetch lock"):
        local_or_fetched(config, hex_of(DATA))
