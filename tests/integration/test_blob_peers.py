"""Two real `provisiond serve` on loopback, each the other's peer: the second, missing the
image's blobs, fetches them from the first, checks them and serves them; a copy changed on
the first's disk is refused, and the second's store is never left with a partial or wrong
blob; a blob neither has is a 404 (the two do not ask each other in turn)."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from provisiond.config import load_config, write_default_config
from tests.integration.boot.servers import free_port, start_serve, stop_serve, wait_http
from tests.integration.boot.servers import write_config
from tests.unit.boot.bootdata import add_blob, add_image


def get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(first's state, its URL, second's state, its URL): each names the other as its peer;
    the first holds image tiny and a 3 MB layer, the second nothing."""
    tmp = tmp_path_factory.mktemp("peers")
    states, ports = [tmp / "first", tmp / "second"], [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for state, port, other in zip(states, ports, reversed(urls)):
        write_default_config(state)
        write_config(state, http={"bind": "127.0.0.1", "port": port, "workers": 2},
                     peers={"urls": [other], "timeout": 5, "fetch_seconds": 60})
    add_image(load_config(states[0]), "tiny")
    procs = []
    try:
        for state, url in zip(states, urls):
            procs.append(start_serve(state, "--http"))
            wait_http(f"{url}/boot/ipxe", procs[-1])
        yield states[0], urls[0], states[1], urls[1]
    finally:
        for proc in procs:
            stop_serve(proc)


def blob_files(state: Path) -> list[str]:
    folder = load_config(state).blob_dir
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_blob_missing_on_the_second_server_is_fetched_checked_and_served(servers):
    first, first_url, second, second_url = servers
    big = add_blob(load_config(first), bytes(range(256)) * 12_000)[7:]
    for hexdigest in blob_files(first):
        assert hexdigest not in blob_files(second)
        status, body = get(f"{second_url}/blobs/sha256/{hexdigest}")
        assert status == 200 and hashlib.sha256(body).hexdigest() == hexdigest
        assert hexdigest in blob_files(second)
    assert big in blob_files(second)
    status, body = get(f"{second_url}/blobs/sha256/{big}", {"Range": "bytes=0-9"})
    assert status == 206 and body == bytes(range(10))
    assert blob_files(second) == blob_files(first)  # no temp file left either


def test_a_copy_changed_on_the_peers_disk_is_refused(servers):
    first, _, second, second_url = servers
    data = b"a layer the first server's disk will corrupt" * 1000
    hexdigest = add_blob(load_config(first), data)[7:]
    (load_config(first).blob_dir / hexdigest).write_bytes(data[:-1] + b"!")
    before = blob_files(second)
    status, body = get(f"{second_url}/blobs/sha256/{hexdigest}")
    error = json.loads(body)["error"]
    assert status == 502 and error["code"] == "blob_unavailable", body
    assert "refused" in error["message"]
    assert blob_files(second) == before  # neither the wrong bytes nor a temp file
    status, _ = get(f"{second_url}/blobs/sha256/{hexdigest}", {"Range": "bytes=0-9"})
    assert status == 502 and blob_files(second) == before


def test_a_blob_neither_server_has_is_not_found(servers):
    _, first_url, _, second_url = servers
    missing = hashlib.sha256(b"nowhere").hexdigest()
    for url in (first_url, second_url):
        status, body = get(f"{url}/blobs/sha256/{missing}")
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found", body
