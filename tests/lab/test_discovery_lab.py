"""Discovery with real VMs: a VM whose MAC no node has PXE-boots the discovery image from a
pool lease, enlists with its facts (vCPUs and memory as libvirt defines them), is approved
with a name from a sequence and reaches `ready` as that node without being touched (its
discovery loop reboots it); a second VM is approved by a rule as it reports."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from provisiond.discovery.facts import facts_of
from provisiond.discovery.machines import book_path, read_book
from provisiond.discovery.rules import rules_path
from provisiond.inventory import InventoryStore
from pvlab import provision, report, strangers
from pvlab.layout import SERVER_ADDRESS

pytestmark = pytest.mark.lab
DISCOVERY = {"pool": "10.99.77.200-10.99.77.220", "gateway": SERVER_ADDRESS}


@pytest.fixture(scope="module")
def discovery_lab(lab):
    """The lab's serve restarted with discovery on and the discovery image built; both
    put back (and every trace of the test's machines removed) afterwards."""
    lab.build_image("discovery")
    path = lab.state.state_dir / "provisiond.yaml"
    saved = path.read_text()
    data = yaml.safe_load(saved)
    data["dhcp"]["discovery"] = True
    data["discovery"] = DISCOVERY
    restart_serve(lab, yaml.safe_dump(data, sort_keys=False))
    made = []
    try:
        yield lab, made
    finally:
        strangers.remove(lab.state, made)
        made_nodes = [n for n in InventoryStore(lab.config).read().nodes
                      if n.startswith(("d0", "d10", "r"))]
        if made_nodes:
            cli(lab, "node", "delete", ",".join(made_nodes), "--yes", check=False)
        rules_path(lab.config).unlink(missing_ok=True)
        book_path(lab.config).unlink(missing_ok=True)
        restart_serve(lab, saved)


def restart_serve(lab, settings: str) -> None:
    provision.stop_serve(lab.state)
    (lab.state.state_dir / "provisiond.yaml").write_text(settings)
    lab.start_serve()


def cli(lab, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(provision.provisiond_cmd(lab.state, *args), capture_output=True,
                            text=True, timeout=120, cwd=provision.REPO_ROOT)
    assert not check or result.returncode == 0, result.stderr
    return result


def wait_for(predicate, seconds: float, what: str, lab, node) -> object:
    deadline = time.monotonic() + seconds
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {seconds} s; console:\n"
                        f"{strangers.domains.serial_tail(node, 25)}")
        time.sleep(1)


def enlisted(lab, node, seconds: float = 420):
    return wait_for(lambda: read_book(lab.config).machines.get(node.mac), seconds,
                    f"{node.mac} enlisting", lab, node)


def ready(lab, name: str, node, seconds: float = 420) -> dict:
    statuses = lab.wait_ready([name], seconds)
    assert statuses[name].get("phase") == "ready", (
        f"{statuses}\n{report.failure_report(lab, statuses)}\n"
        f"{strangers.domains.serial_tail(node, 25)}")
    return statuses[name]


def test_an_unknown_vm_enlists_is_approved_from_a_sequence_and_becomes_ready(discovery_lab):
    lab, made = discovery_lab
    node = strangers.stranger(lab.state, 1, vcpus=2, memory_mib=1024)
    made.append(node)
    vcpus, memory = strangers.defined(lab.state, node)
    strangers.start(lab.state, node)
    machine = enlisted(lab, node)
    assert machine.state.value == "pending" and machine.address.startswith("10.99.77.2")
    assert (machine.facts.cpu.threads, machine.facts.memory_mib) == (vcpus, memory)
    assert machine.mac in [nic.mac for nic in machine.facts.nics]
    assert machine.facts.dmi.uuid and machine.facts.dmi.uuid.lower() == node.uuid.lower()
    listed = cli(lab, "discover", "list").stdout
    assert node.mac in listed and "pending" in listed
    approved_at = time.time()
    out = cli(lab, "discover", "approve", "--names", "d[01-10]", "--ipaddr", "10.99.77.101",
              "--gateway", SERVER_ADDRESS).stdout
    assert f"approved {node.mac} as d01" in out
    status = ready(lab, "d01", node)
    assert status["phases"]["dhcp"] > approved_at
    booted_at = status["phases"]["dhcp"]
    reported = wait_for(  # the agent's report at the node's boot, sent after `ready`
        lambda: (found := facts_of(lab.config, "d01")) and found.time > booted_at and found,
        120, "d01's facts", lab, node)
    assert (reported.facts.cpu.threads, reported.facts.memory_mib) == (vcpus, memory)
    assert "# facts reported" in cli(lab, "node", "show", "d01").stdout


def test_a_second_unknown_vm_is_approved_by_a_rule(discovery_lab):
    lab, made = discovery_lab
    node = strangers.stranger(lab.state, 2, vcpus=1, memory_mib=768)
    made.append(node)
    rules_path(lab.config).parent.mkdir(parents=True, exist_ok=True)
    rules_path(lab.config).write_text(
        f"- name: small\n  match: {{mac: '52:54:00:99:78:*', memory_mib: 768}}\n"
        f"  profile: default\n  names: r[1-5]\n  ipaddr: 10.99.77.111\n"
        f"  gateway: {SERVER_ADDRESS}\n")
    assert "small" in cli(lab, "discover", "rules").stdout
    strangers.start(lab.state, node)
    machine = enlisted(lab, node)
    status = ready(lab, "r1", node)
    machine = read_book(lab.config).machines[node.mac]
    assert (machine.state.value, machine.node, machine.decided_by) == (
        "approved", "r1", "rule:small")
    assert status["phase"] == "ready"
