"""examples/inventory_sync.py against a real `provisiond serve` on loopback: nodes from a CSV
created, then patched only where they differ (If-Match; a 412 from a concurrent writer read
again and retried once), overlays built and the nodes powered on through jobs (the fake BMC
driver), events followed until ready; a deadline, a failure and bad input exit non-zero in
one line. A thread plays the nodes: once a node's fake BMC booted, it records the phases a
real boot reports."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from provisiond.config import load_config
from provisiond.power.fake import read_fake_bmcs
from provisiond.states import NodePhase
from provisiond.status import record_phase
from servers import REPO, api_call, free_port, start_serve, stop_serve, wait_http, write_config
from tests.conftest import run_provisiond

EXAMPLE = REPO / "examples" / "inventory_sync.py"
HEADER = "name,mac,ipaddr,netmask,profile,bmc_driver,bmc_address\n"
BOOT = [NodePhase.DHCP, NodePhase.IPXE, NodePhase.KERNEL, NodePhase.BOOTED, NodePhase.READY]
DEADLINE = 60.0


def cli(state: Path, *args: str) -> str:
    done = run_provisiond(state, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(state dir, port, {role: token}) of a serve with no nodes yet."""
    state = tmp_path_factory.mktemp("sync") / "state"
    cli(state, "init")
    port = free_port()
    write_config(state, http={"bind": "127.0.0.1", "port": port, "workers": 1})
    tokens = {role: cli(state, "token", "create", "--role", role, "--name", f"sync-{role}")
              for role in ("admin", "operator")}
    proc = start_serve(state)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v1/openapi.json", proc)
        yield state, port, tokens
    finally:
        stop_serve(proc)


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "".join(f"{row}\n" for row in rows))
    return path


def sync(served, csv: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    state, port, tokens = served
    environ = {"PATH": os.environ.get("PATH", ""), "PROVISIOND_TOKEN": tokens["admin"],
               "PROVISIOND_OPERATOR_TOKEN": tokens["operator"], **(env or {})}
    return subprocess.run([sys.executable, str(EXAMPLE), str(csv), "--url",
                           f"http://127.0.0.1:{port}", *args], env=environ, text=True,
                          capture_output=True, timeout=DEADLINE + 30)


def play_nodes(state: Path, names: list[str], last: list[NodePhase]) -> threading.Thread:
    """A thread that, once each node's fake BMC has booted, records its boot phases."""
    config = load_config(state)
    path = config.state_dir / "power" / "fake-bmcs.json"

    def run() -> None:
        waiting, deadline = set(names), time.monotonic() + DEADLINE
        while waiting and time.monotonic() < deadline:
            booted = {n for n in waiting if (read_fake_bmcs(path).get(n) or {}).get("boots")}
            for name in sorted(booted):
                for phase in last:
                    record_phase(config, name, phase)
            waiting -= booted
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def node(served, name: str) -> dict:
    _, port, tokens = served
    status, _, body = api_call(port, tokens["admin"], "GET", f"/api/v1/nodes/{name}")
    assert status == 200, body
    return body["record"]


def test_sync_creates_builds_powers_and_waits_until_ready(served, tmp_path):
    csv = write_csv(tmp_path / "nodes.csv", ["s1,52:54:00:aa:00:01,10.5.0.1,255.255.0.0,"
                                             "default,fake,bmc-s1",
                                             "s2,52:54:00:aa:00:02,10.5.0.2,255.255.0.0,"
                                             "default,fake,bmc-s2"])
    (tmp_path / "bmc-pw").write_text("hunter2\n")
    player = play_nodes(served[0], ["s1", "s2"], BOOT)
    done = sync(served, csv, "--bmc-password-file", str(tmp_path / "bmc-pw"),
                "--build-overlays", "--power-on", "--wait", str(DEADLINE))
    player.join(DEADLINE)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["s1: created", "s2: created"], lines
    assert "s1: ready" in lines and "s2: ready" in lines and lines[-1] == "ready: s1,s2", lines
    assert any(line.startswith("overlays built (job ") for line in lines), lines
    assert node(served, "s2")["netdevs"]["eth0"]["ipaddr"] == "10.5.0.2"
    assert node(served, "s1")["bmc"] == {"driver": "fake", "address": "bmc-s1"}
    _, port, tokens = served
    _, _, secrets = api_call(port, tokens["admin"], "GET", "/api/v1/secrets")
    assert {s["name"] for s in secrets["items"] if "bmc_password" in s["keys"]} >= {"s1", "s2"}


def test_a_second_sync_patches_only_what_differs(served, tmp_path):
    rows = ["p1,52:54:00:aa:01:01,10.6.0.1,255.255.0.0,default,fake,bmc",
            "p2,52:54:00:aa:01:02,10.6.0.2,255.255.0.0,default,fake,bmc"]
    assert sync(served, write_csv(tmp_path / "a.csv", rows)).returncode == 0
    _, port, tokens = served
    api_call(port, tokens["admin"], "PATCH", "/api/v1/nodes/p1", {"comment": "kept"},
             {"Content-Type": "application/merge-patch+json"})
    rows[0] = rows[0].replace("10.6.0.1", "10.6.9.1")
    done = sync(served, write_csv(tmp_path / "b.csv", rows))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["p1: patched netdevs", "p2: unchanged"]
    record = node(served, "p1")
    assert record["netdevs"]["eth0"]["ipaddr"] == "10.6.9.1"
    assert record["netdevs"]["eth0"]["mac"] == "52:54:00:aa:01:01"
    assert record["comment"] == "kept"  # a field the CSV does not own is left alone


def load_example():
    spec = importlib.util.spec_from_file_location("inventory_sync", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_412_from_a_concurrent_writer_is_read_again_and_retried_once(served, tmp_path):
    example = load_example()
    _, port, tokens = served
    url = f"http://127.0.0.1:{port}"
    api = example.Api(url, tokens["admin"])
    assert example.sync_node(api, "r1", {"image": "tiny"}) == "created"

    class Interloper(requests.Session):
        """Between the example's GET and its PATCH, another writer changes the node."""
        writes = 0

        def request(self, method, *args, **kw):
            if method == "PATCH" and Interloper.writes == 0:
                Interloper.writes += 1
                status, _, body = api_call(port, tokens["admin"], "PATCH", "/api/v1/nodes/r1",
                                           {"tags": {"rack": "b2"}},
                                           {"Content-Type": "application/merge-patch+json"})
                assert status == 200, body
            return super().request(method, *args, **kw)

    api = example.Api(url, tokens["admin"], Interloper())
    assert example.sync_node(api, "r1", {"image": "debian12"}) == "patched image after a 412"
    record = node(served, "r1")
    assert record["image"] == "debian12" and record["tags"] == {"rack": "b2"}  # none lost


def test_no_ready_by_the_deadline_and_a_failed_node_exit_1(served, tmp_path):
    late = write_csv(tmp_path / "late.csv", ["d1,52:54:00:aa:02:01,10.7.0.1,255.255.0.0,"
                                             "default,fake,bmc"])
    done = sync(served, late, "--power-on", "--wait", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == "inventory_sync: not ready by the deadline: d1\n"
    bad = write_csv(tmp_path / "bad.csv", ["f1,52:54:00:aa:02:02,10.7.0.2,255.255.0.0,"
                                           "default,fake,bmc"])
    player = play_nodes(served[0], ["f1"], [NodePhase.DHCP, NodePhase.FAILED])
    done = sync(served, bad, "--power-on", "--wait", str(DEADLINE))
    player.join(DEADLINE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("inventory_sync: f1 failed") and done.stderr.count("\n") == 1


def test_bad_input_exits_2_in_one_line(served, tmp_path):
    csv = write_csv(tmp_path / "ok.csv", ["b1,52:54:00:aa:03:01,10.8.0.1,255.255.0.0,"
                                          "default,fake,bmc"])
    cases = [
        (csv, {"PROVISIOND_TOKEN": ""}, "no token: set PROVISIOND_TOKEN or give --token-file"),
        (csv, {"PROVISIOND_TOKEN": "wrong"}, "GET /nodes/b1: 401"),
        (write_csv(tmp_path / "noname.csv", [",52:54:00:aa:03:02,10.8.0.2,,,,"]), {},
         "noname.csv:2: the name column is empty or missing"),
        (tmp_path / "missing.csv", {}, "missing.csv"),
    ]
    for path, env, expected in cases:
        done = sync(served, path, env=env)
        assert done.returncode == 2, (expected, done.stdout, done.stderr)
        assert expected in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr
    done = sync(served, csv, "--token", "secret")  # no token in argv: not even an option
    assert done.returncode == 2 and "unrecognized arguments: --token secret" in done.stderr
