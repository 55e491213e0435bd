"""reprovision: PXE once + cycle, then wait for `ready` from a boot newer than the start."""

from __future__ import annotations

import argparse
import threading
import time

import pytest

from provisiond.cli.power import add_reprovision_parser
from provisiond.power import reprovision
from provisiond.power.fake import read_fake_bmcs
from provisiond.states import NodePhase
from provisiond.status import record_phase


@pytest.fixture
def nodes(cli):
    cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc")
    return cli


def boot_when_cycled(config, phases: dict[str, list[NodePhase]]):
    """Play each node's phases once its fake BMC shows a PXE boot (a node's agent)."""
    path = config.state_dir / "power" / "fake-bmcs.json"

    def agent():
        deadline = time.monotonic() + 120
        todo = dict(phases)
        while todo and time.monotonic() < deadline:
            state = read_fake_bmcs(path)
            for node in [n for n in todo if "pxe" in state.get(n, {}).get("boots", [])]:
                for phase in todo.pop(node):
                    record_phase(config, node, phase)
            time.sleep(0.05)

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    return thread


def test_ready_and_failed_per_node(nodes, config):
    """Each node's own outcome; the wait ends as soon as every node has one (the timeout is
    far away, so a slow machine cannot turn a boot into a timeout)."""
    boot_when_cycled(config, {
        "n1": [NodePhase.DHCP, NodePhase.KERNEL, NodePhase.READY],
        "n2": [NodePhase.DHCP, NodePhase.FAILED],
    })
    results = _in_thread(lambda: reprovision(config, "n[1-2]", timeout=3600))
    assert results["n1"].ok and results["n1"].detail.startswith("ready after")
    assert not results["n2"].ok and results["n2"].detail.startswith("boot failed")
    boots = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert all(boots[n]["boots"] == ["pxe"] for n in ("n1", "n2"))


def test_a_ready_from_an_older_boot_does_not_count(nodes, config):
    record_phase(config, "n3", NodePhase.DHCP)
    record_phase(config, "n3", NodePhase.READY)  # an old boot: must not count
    results = {r.node: r for r in reprovision(config, "n3", timeout=0.5)}
    assert not results["n3"].ok and "no boot seen" in results["n3"].detail
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n3"]["boots"] == [
        "pxe"]


def test_bmc_failure_is_reported_without_waiting(nodes, config):
    """A node whose BMC failed is not waited for: with an hour's timeout, the call still
    returns (within the bounded wait below) with the BMC's error."""
    nodes("node", "add", "n9", "--bmc-driver", "fake", "--bmc-address", "unreachable")
    results = _in_thread(lambda: reprovision(config, ["n9"], timeout=3600))
    assert not results["n9"].ok and "unreachable" in results["n9"].detail


def _in_thread(call, seconds: float = 120) -> dict:
    """`call()`'s results by node; fails if it has not returned within `seconds`."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"still waiting after {seconds} s"
    return {r.node: r for r in box[0]}


def test_boot_once_false_is_reset_to_disk_after_ready(nodes, config):
    nodes("node", "set", "n1", "--no-bmc-boot-once")
    boot_when_cycled(config, {"n1": [NodePhase.DHCP, NodePhase.READY]})
    result = _in_thread(lambda: reprovision(config, "n1", timeout=3600))["n1"]
    assert result.ok, result.detail
    assert "pending reset done" in result.detail
    boot = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n1"]["boot"]
    assert boot == {"device": "disk", "persistent": True, "uefi": None}


def test_parser_and_handler_for_the_node_noun(nodes, config, ctx_for, capsys):
    parser = argparse.ArgumentParser()
    add_reprovision_parser(parser.add_subparsers())
    args = parser.parse_args(["reprovision", "n1", "--timeout", "0.2", "--json"])
    assert args.func(args, ctx_for(config)) == 7
    assert '"result": "error"' in capsys.readouterr().out


def test_a_forged_ready_does_not_end_the_wait(config):
    """During the wait, `ready` without a credential and with the node's credential from
    before the reprovision are both refused (401), so the result is the new boot's own
    report (here `failed`, which ends the wait at once): never the forgery's `ready`."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "boot"))
    from bootdata import add_image, add_nodes, credential, node_env
    from provisiond.api import create_app
    from provisiond.inventory import InventoryStore
    from provisiond.inventory.model import Bmc

    add_nodes(config, 1)
    add_image(config, "tiny")
    with InventoryStore(config).edit() as inv:
        inv.nodes["n1"].bmc = Bmc(driver="fake", address="bmc")
    client = create_app(config).test_client()
    client.application.extensions["provisiond"].watcher.interval = 0
    old = credential(client, 1)  # the running node's, from its previous boot
    forged: list[int] = []

    def post(phase: str, headers: dict) -> int:
        return client.post("/api/v1/status/n1", data={"phase": phase, "detail": "new boot"},
                           environ_base=node_env(1), headers=headers).status_code

    def forger_then_the_real_boot():
        path = config.state_dir / "power" / "fake-bmcs.json"
        deadline = time.monotonic() + 120
        while "pxe" not in read_fake_bmcs(path).get("n1", {}).get("boots", []):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        record_phase(config, "n1", NodePhase.DHCP)  # the server sees the new boot
        forged.extend([post("ready", {}), post("ready", old)])
        assert post("failed", credential(client, 1)) == 200

    threading.Thread(target=forger_then_the_real_boot, daemon=True).start()
    results = _in_thread(lambda: reprovision(config, "n1", timeout=3600))
    assert forged == [401, 401]
    assert not results["n1"].ok and results["n1"].detail == "boot failed: new boot"


def test_a_node_that_is_off_is_powered_on_one_that_is_on_cycled(nodes, config):
    """Without the wait (Slurm's resume): each BMC takes the PXE boot and the call ends."""
    assert nodes("power", "on", "n2").code == 0
    results = {r.node: r for r in reprovision(config, "n[1-2]", timeout=5, wait=False)}
    assert [(results[n].ok, results[n].detail) for n in ("n1", "n2")] == [
        (True, "boot pxe once, power on"), (True, "boot pxe once, power cycled")]
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert [bmcs[n]["power"] for n in ("n1", "n2")] == ["on", "on"]
