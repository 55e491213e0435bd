"""Jobs and the event stream of a real `provisiond serve` (gunicorn, the gevent worker) on
loopback: power jobs over fake, IPMI (pyghmi's BMC) and Redfish (sushy-tools) nodes with a
result per node, 409 on a busy node until its runner dies, a runner that outlives its
worker, an SSE client resuming with Last-Event-ID, the per-worker stream bound, and serve
stopping with a stream open."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from provisiond import events
from provisiond.config import load_config
from provisiond.jobs.store import process_start
from servers import api_call, free_port, start_serve, stop_serve, wait_http, write_config
from tests.conftest import run_provisiond
from tests.integration.test_power_ipmi import PASSWORD as IPMI_PASSWORD, USER as IPMI_USER
from tests.integration.test_power_ipmi import bmc_processes, free_udp_ports
from tests.integration.test_power_redfish import PASSWORD as REDFISH_PASSWORD
from tests.integration.test_power_redfish import USER as REDFISH_USER
from tests.integration.test_power_redfish import libvirt_emulator  # noqa: F401 - a fixture

STREAMS = 2  # http.event_streams of the served worker
DEADLINE = 60.0


def cli(state: Path, *args: str) -> str:
    done = run_provisiond(state, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def make_token(state: Path, role: str) -> str:
    return cli(state, "token", "create", "--role", role, "--name", f"it-{role}")


def serve_on(state: Path) -> tuple[object, int]:
    """`provisiond serve` of `state` with one HTTP worker on a free loopback port."""
    port = free_port()
    write_config(state, http={"bind": "127.0.0.1", "port": port, "workers": 1,
                              "event_streams": STREAMS})
    proc = start_serve(state)
    wait_http(f"http://127.0.0.1:{port}/api/v1/openapi.json", proc)
    return proc, port


@pytest.fixture(scope="module")
def ipmi_ports():
    ports = free_udp_ports(3)
    with bmc_processes(ports):  # one process per BMC, as virtualbmc runs them
        yield ports


@pytest.fixture(scope="module")
def served(tmp_path_factory, ipmi_ports, libvirt_emulator):  # noqa: F811
    """(config, port, {role: token}) of a serve whose inventory holds fake nodes n[01-04],
    h1 (a fake BMC that never answers), IPMI nodes i[1-3] and a Redfish node r1."""
    root = tmp_path_factory.mktemp("jobs")
    state = root / "state"
    cli(state, "init")
    cli(state, "node", "add", "n[01-04]", "--bmc-driver", "fake", "--bmc-address", "bmc")
    cli(state, "node", "add", "h1", "--bmc-driver", "fake", "--bmc-address", "hang")
    (root / "ipmi-pw").write_text(IPMI_PASSWORD)
    for i, port in enumerate(ipmi_ports, 1):
        cli(state, "node", "add", f"i{i}", "--bmc-driver", "ipmi", "--bmc-address", "127.0.0.1",
            "--bmc-port", str(port), "--bmc-username", IPMI_USER, "--bmc-password-file",
            str(root / "ipmi-pw"), "--bmc-cipher-suite", "3")
    redfish_port, ca_file, _ = libvirt_emulator
    (root / "redfish-pw").write_text(REDFISH_PASSWORD)
    cli(state, "node", "add", "r1", "--bmc-driver", "redfish", "--bmc-address", "127.0.0.1",
        "--bmc-port", str(redfish_port), "--bmc-username", REDFISH_USER,
        "--bmc-password-file", str(root / "redfish-pw"), "--bmc-ca-file", str(ca_file))
    tokens = {role: make_token(state, role) for role in ("reader", "operator")}
    proc, port = serve_on(state)
    try:
        yield load_config(state), port, tokens
    finally:
        stop_serve(proc)


def call(served, method: str, path: str, body=None, role: str = "operator"):
    """(status, headers, JSON) of one request with the role's token."""
    _, port, tokens = served
    return api_call(port, tokens[role], method, path, body)


def start(served, path: str, body: dict) -> dict:
    status, headers, job = call(served, "POST", path, body)
    assert status == 202, job
    assert headers["Location"] == f"/api/v1/jobs/{job['id']}"
    return job


def wait_job(served, job_id: int, until=lambda job: job["state"] in ("finished", "failed")
             ) -> dict:
    deadline = time.monotonic() + DEADLINE
    while True:
        status, _, job = call(served, "GET", f"/api/v1/jobs/{job_id}", role="reader")
        assert status == 200, job
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def results(job: dict) -> list[tuple[str, str, str]]:
    return [(r["name"], r["result"], r["detail"]) for r in job["results"]]


def test_a_power_job_across_a_range_has_a_result_per_node(served):
    job = start(served, "/api/v1/power", {"names": "n[01-04]", "action": "on"})
    assert job["state"] in ("pending", "running") and job["actor"] == "token:it-operator"
    done = wait_job(served, job["id"])
    assert done["state"] == "finished", done
    assert results(done) == [(f"n0{i}", "ok", "on requested") for i in range(1, 5)]
    status = wait_job(served, start(served, "/api/v1/power", {"names": "n[01-02]",
                                                              "action": "status"})["id"])
    assert results(status) == [("n01", "ok", "on"), ("n02", "ok", "on")]


def test_ipmi_and_redfish_bmcs_in_one_job(served):
    """pyghmi's and sushy's threads run in the job's runner, never in the gevent worker."""
    for action, detail in (("on", "on requested"), ("status", "on"), ("off", "off requested"),
                           ("status", "off")):
        job = start(served, "/api/v1/power", {"names": "i[1-3],r1", "action": action})
        done = wait_job(served, job["id"])
        assert results(done) == [(n, "ok", detail) for n in ("i1", "i2", "i3", "r1")], done
    boot = wait_job(served, start(served, "/api/v1/bootdev", {"names": "i1", "device": "pxe"}
                                  )["id"])
    assert results(boot) == [("i1", "ok", "pxe once")]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def test_a_busy_node_is_409_a_runner_outlives_its_worker_and_its_death_frees_the_node(served):
    config, port, _ = served
    hung = start(served, "/api/v1/power", {"names": "h1", "action": "on"})
    running = wait_job(served, hung["id"], lambda job: job["state"] == "running")
    status, _, answer = call(served, "POST", "/api/v1/reprovision", {"names": "h1"})
    assert status == 409 and answer["error"]["code"] == "conflict"
    assert answer["error"]["message"] == (f"node h1 is busy: job {hung['id']} (power h1, by "
                                          "token:it-operator) is running")
    runner = running["runner_pid"]
    worker = parent_of(runner)
    assert Path(f"/proc/{worker}/cmdline").read_bytes().find(b"gunicorn") >= 0
    os.kill(worker, signal.SIGKILL)  # the worker that started the runner dies
    deadline = time.monotonic() + DEADLINE
    while call(served, "GET", "/api/v1/jobs?limit=1", role="reader")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert process_start(runner) == running["runner_start"]
    assert call(served, "GET", f"/api/v1/jobs/{hung['id']}", role="reader")[2]["state"] == \
        "running"
    assert call(served, "POST", "/api/v1/power", {"names": "h1", "action": "off"})[0] == 409
    os.kill(runner, signal.SIGKILL)  # a crash: the runner never finishes the job
    failed = wait_job(served, hung["id"])
    assert failed["state"] == "failed"
    assert failed["message"].startswith(f"the job's runner (pid {runner}) ended without "
                                        "finishing it")
    again = start(served, "/api/v1/power", {"names": "h1", "action": "status",
                                            "timeout": 0.5})
    assert results(wait_job(served, again["id"])) == [("h1", "error", "no answer within 0.5 s")]


class SseClient:
    """An event stream read line by line over a plain HTTP connection."""

    def __init__(self, served, query: str = "", last_id: int | None = None):
        _, port, tokens = served
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Authorization": f"Bearer {tokens['reader']}"}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        self.conn.request("GET", f"/api/v1/events{query}", headers=headers)
        self.response = self.conn.getresponse()

    def messages(self):
        """Each message: {"id": int | None, "data": dict} or {"comment"}; ends at EOF."""
        fields: dict = {}
        while True:
            line = self.response.readline().decode()
            if not line:
                return
            line = line.rstrip("\n")
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "data" in fields:
                yield {"id": int(fields["id"]) if "id" in fields else None,
                       "data": json.loads(fields["data"])}
            elif "" in fields:
                yield {"comment": fields[""]}
            fields = {}

    def close(self):
        if self.conn.sock is not None:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def read_until(client: SseClient, stop) -> list[dict]:
    """The messages up to the one `stop` accepts; bounded (a keepalive comes every 15 s)."""
    seen, deadline = [], time.monotonic() + DEADLINE
    for message in client.messages():
        if "data" in message:
            seen.append(message)
            if stop(message):
                return seen
        assert time.monotonic() < deadline, f"not seen in {DEADLINE:g} s; seen {seen}"
    raise AssertionError(f"the stream ended; seen {seen}")


def test_an_sse_client_resumes_with_last_event_id_without_gap_or_duplicate(served):
    config = served[0]
    start_id = events.latest_id(config)
    first = SseClient(served, f"?after={start_id}")
    assert first.response.status == 200
    assert first.response.getheader("Content-Type").startswith("text/event-stream")
    job = start(served, "/api/v1/power", {"names": "n[01-04]", "action": "cycle"})
    seen = read_until(first, lambda m: m["data"]["kind"] == "job.started"
                      and m["data"]["data"]["job"] == job["id"])
    first.close()  # gone in the middle of the job
    wait_job(served, job["id"])
    second = start(served, "/api/v1/power", {"names": "n01", "action": "status"})
    wait_job(served, second["id"])
    resumed = SseClient(served, last_id=seen[-1]["id"])
    try:
        seen += read_until(resumed, lambda m: m["data"]["kind"] == "job.finished"
                           and m["data"]["data"]["job"] == second["id"])
    finally:
        resumed.close()
    ids = [m["id"] for m in seen]
    assert ids == list(range(start_id + 1, ids[-1] + 1))  # no gap, no duplicate
    journal = [e.id for e in events.read_since(config, start_id) if e.id <= ids[-1]]
    assert ids == journal
    assert all(m["data"]["kind"] != "stream.gap" for m in seen)
    kinds = [m["data"]["kind"] for m in seen if m["data"]["subject"] == f"job/{job['id']}"]
    assert kinds[0] == "job.started" and kinds[-1] == "job.finished"
    assert sum(len(m["data"]["data"].get("results", [])) for m in seen
               if m["data"]["subject"] == f"job/{job['id']}") == 4


def open_stream(served) -> SseClient:
    """A stream, once the worker has a slot: a slot of a client gone is freed when the
    server next writes to it, so each refusal is followed by an event."""
    deadline = time.monotonic() + DEADLINE
    while True:
        client = SseClient(served)
        if client.response.status == 200:
            return client
        assert client.response.status == 503, client.response.read()
        client.response.read()
        client.close()
        events.emit(served[0], "test.nudge")
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_streams_per_worker_are_bounded(served):
    opened = []
    try:
        opened += [open_stream(served) for _ in range(STREAMS)]
        refused = SseClient(served)
        opened.append(refused)  # closed at the end if it were a stream after all
        assert refused.response.status == 503
        assert refused.response.getheader("Content-Type") == "application/json"
        answer = json.loads(refused.response.read())
        assert answer["error"]["code"] == "unavailable"
        assert "already serves 2 event streams" in answer["error"]["message"]
        opened.pop().close()
        opened.pop(0).close()
        opened.append(open_stream(served))
    finally:
        for client in opened:
            client.close()


def test_serve_stops_with_a_stream_open(tmp_path):
    """The stream ends, whole (the chunked body's end, no reset), and serve exits 0."""
    state = tmp_path / "state"
    cli(state, "init", "--no-profiles")  # the profiles' import is an inventory.changed event
    token = make_token(state, "reader")
    proc, port = serve_on(state)
    try:
        client = SseClient((None, port, {"reader": token}), "?after=0")
        assert client.response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert list(client.messages()) == []
        client.close()
    finally:
        assert stop_serve(proc) == 0
