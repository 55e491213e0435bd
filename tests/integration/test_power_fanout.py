"""Fan-out over 50 BMCs of which 5 never answer: 45 sushy-tools fake-driver systems and 5
addresses behind a veth pair whose far end holds no address (permanent neighbour entries,
so the SYNs leave and nothing ever answers), all inside a network namespace this test
creates; the fan-out itself runs inside it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.boot.netns import in_netns
from tests.integration.test_power_redfish import EMULATOR, PASSWORD, USER, start_emulator
from tests.tools import command, tool

pytestmark = [pytest.mark.netns, pytest.mark.skipif(
    os.geteuid() != 0 or not tool("ip"), reason="needs root and iproute2")]

LIVE, DEAD = 45, 5
DEAD_NET = "10.250.77"
TIMEOUT = 10.0  # per BMC; the 45 live ones answer in about 3 s together


def ip(*args: str) -> None:
    subprocess.run(command(["ip", *args]), check=True, capture_output=True)


@pytest.fixture
def namespace():
    """A namespace with lo and veth pd0 (10.250.77.1/24) whose peer pd1 has no address;
    deleted afterwards."""
    name = f"pdfan{os.getpid()}"
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "link", "add", "pd0", "type", "veth", "peer", "name", "pd1")
        ip("-n", name, "addr", "add", f"{DEAD_NET}.1/24", "dev", "pd0")
        for link in ("pd0", "pd1"):
            ip("-n", name, "link", "set", link, "up")
        for i in range(DEAD):
            ip("-n", name, "neigh", "add", f"{DEAD_NET}.{10 + i}", "lladdr",
               f"02:00:00:00:00:{10 + i:02x}", "dev", "pd0", "nud", "permanent")
        yield name
    finally:
        subprocess.run(command(["ip", "netns", "del", name]), capture_output=True)


@pytest.fixture
def fake_emulator(namespace, tmp_path, monkeypatch):
    """(port, system uuids) of sushy-emulator's fake driver with 45 systems, in the netns."""
    systems = [{"uuid": str(uuid.uuid4()), "name": f"fake{i}", "power_state": "Off",
                "nics": []} for i in range(1, LIVE + 1)]
    monkeypatch.setattr(sys.modules[start_emulator.__module__], "EMULATOR",
                        in_netns(namespace, EMULATOR))
    monkeypatch.setattr(sys.modules[start_emulator.__module__], "wait_for_emulator",
                        lambda proc, port, tls: wait_in_namespace(namespace, proc, port))
    proc, port, _ = start_emulator(tmp_path / "sushy-fake", {
        "SUSHY_EMULATOR_FAKE_DRIVER": True, "SUSHY_EMULATOR_FAKE_SYSTEMS": systems})
    yield port, [s["uuid"] for s in systems]
    proc.kill()
    proc.wait(10)


def wait_in_namespace(namespace: str, proc: subprocess.Popen, port: int) -> None:
    probe = ("import urllib.request,sys; urllib.request.urlopen("
             f"'http://127.0.0.1:{port}/redfish/v1', timeout=1)")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "sushy-emulator exited"
        if subprocess.run(in_netns(namespace, [sys.executable, "-c", probe]),
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise AssertionError("sushy-emulator did not answer in the namespace")


def write_inventory(state_dir: Path, port: int, uuids: list[str], secret: Path) -> None:
    bmc = {"driver": "redfish", "username": USER, "password_file": str(secret),
           "scheme": "http"}
    nodes = {f"f{i}": {"bmc": {**bmc, "address": "127.0.0.1", "port": port,
                               "system_id": system}}
             for i, system in enumerate(uuids, 1)}
    for i in range(DEAD):
        nodes[f"f{LIVE + 1 + i}"] = {"bmc": {**bmc, "address": f"{DEAD_NET}.{10 + i}"}}
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump({"revision": 1, "nodes": nodes}))


def run_in_namespace(namespace: str, state_dir: Path, *args: str) -> list:
    child = subprocess.run(in_netns(namespace, [sys.executable, "-m", "provisiond",
                                                "--state-dir", str(state_dir), *args, "--json"]),
                           capture_output=True, text=True, timeout=300)
    assert child.stderr == "", child.stderr
    return json.loads(child.stdout)


def test_fifty_bmcs_five_dead(namespace, fake_emulator, state_dir, tmp_path):
    port, uuids = fake_emulator
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD)
    write_inventory(state_dir, port, uuids, secret)
    for action in ("status", "on"):
        rows = run_in_namespace(namespace, state_dir, "power", action,
                                f"f[1-{LIVE + DEAD}]", "--timeout", str(TIMEOUT))
        ok = [r for r in rows if r["result"] == "ok"]
        dead = [r for r in rows if r["result"] == "error"]
        assert len(ok) == LIVE and len(dead) == DEAD
        assert {r["node"] for r in dead} == {f"f{LIVE + 1 + i}" for i in range(DEAD)}
        print("dead BMC:", dead[0]["detail"])
        assert all("cannot connect" in r["detail"] or "no answer within" in r["detail"]
                   for r in dead), dead
    assert {r["detail"] for r in ok} == {"on requested"}
