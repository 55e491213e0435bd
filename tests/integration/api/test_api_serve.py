"""The API of a real `provisiond serve` (gunicorn, two worker processes) on loopback: a
token made with the real CLI, and 20 concurrent writers holding stale ETags."""

from __future__ import annotations

import threading

import pytest

from provisiond.config import load_config
from provisiond.inventory import InventoryStore
from servers import (api_call as call, loopback_services, start_serve, stop_serve, wait_http,
                     write_config)
from tests.conftest import run_provisiond

WRITERS = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = tmp_path_factory.mktemp("api") / "state"
    ports = loopback_services(state)
    write_config(state, http={"workers": 2}, tftp={"enabled": False},
                 dns={"enabled": False})
    made = run_provisiond(state, "token", "create", "--role", "admin", "--name", "it")
    assert made.returncode == 0, made.stderr
    proc = start_serve(state)
    try:
        wait_http(f"http://127.0.0.1:{ports['http']}/api/v1/openapi.json", proc)
        yield load_config(state), ports["http"], made.stdout.strip()
    finally:
        stop_serve(proc)


def test_stale_writers_get_412_and_no_write_is_lost(served):
    config, port, token = served
    status, _, _ = call(port, token, "POST", "/api/v1/nodes",
                        {"names": "n1", "record": {"tags": {"start": "1"}}})
    assert status == 201
    _, headers, _ = call(port, token, "GET", "/api/v1/nodes/n1")
    stale = headers["ETag"]  # every writer holds this one
    barrier = threading.Barrier(WRITERS, timeout=60)
    first: dict[int, int] = {}
    tries: dict[int, int] = {}
    statuses: list[int] = []

    def writer(i: int) -> None:
        etag, attempt = stale, 0
        barrier.wait()
        while attempt < 50:
            attempt += 1
            status, _, _ = call(port, token, "PATCH", "/api/v1/nodes/n1",
                                {"tags": {f"w{i}": str(attempt)}}, {"If-Match": etag})
            statuses.append(status)
            first.setdefault(i, status)
            if status != 412:
                break
            _, headers, _ = call(port, token, "GET", "/api/v1/nodes/n1")
            etag = headers["ETag"]
        tries[i] = attempt

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert set(statuses) <= {200, 412}, statuses  # no 5xx, nothing else
    assert sorted(first.values()) == [200] + [412] * (WRITERS - 1)  # one fresh tag won
    tags = InventoryStore(config).read().nodes["n1"].tags
    assert tags == {"start": "1", **{f"w{i}": str(tries[i]) for i in range(WRITERS)}}
    _, _, audit = call(port, token, "GET", "/api/v1/audit?action=node.patch&limit=100")
    assert len(audit["items"]) == WRITERS
    assert {e["actor"] for e in audit["items"]} == {"token:it"}


def test_no_token_and_the_openapi_document_through_gunicorn(served):
    _, port, token = served
    status, headers, body = call(port, "", "GET", "/api/v1/nodes")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert body["error"]["code"] == "unauthenticated"
    status, _, document = call(port, "", "GET", "/api/v1/openapi.json")
    assert status == 200 and document["openapi"] == "3.1.0"
