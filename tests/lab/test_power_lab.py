"""Power, boot device, firmware and reprovision against the VM lab's real BMCs:
sushy-tools (libvirt driver) for Redfish nodes and virtualbmc for IPMI nodes.

Expected of the `lab` fixture (tests/lab/conftest.py, the lab's own; vm-lab/pvlab.Lab):
- lab.config: the provisiond Config of the lab's state dir; its inventory holds the lab
  nodes with working bmc settings (passwords in the secrets store), at least one node with
  bmc.driver redfish and one with ipmi (the lab gives odd nodes Redfish, even ones IPMI);
- lab.nodes: {node name: LabNode}, each with .domain (the libvirt domain name);
- the lab is up with `provisiond serve` running and the nodes' image built, so a PXE boot
  reaches `ready` (lab.wait_ready exists but is not needed: reprovision waits itself);
- lab.serial_tail(name, lines): the end of a VM's serial log, shown when a boot fails.
"""

from __future__ import annotations

import pytest

from provisiond.inventory import load_nodes
from provisiond.power import operations, reprovision
from provisiond.states import BmcDriver, PowerAction

pytestmark = pytest.mark.lab
READY_TIMEOUT = 300.0


def nodes_by_driver(lab) -> dict[BmcDriver, str]:
    """The first lab node of each BMC driver."""
    found: dict[BmcDriver, str] = {}
    for name, node in sorted(load_nodes(lab.config).items()):
        if name in lab.nodes and node.record.bmc and node.record.bmc.driver:
            found.setdefault(node.record.bmc.driver, name)
    assert {BmcDriver.REDFISH, BmcDriver.IPMI} <= set(found), found
    return found


def run(lab, names: list[str], operation, timeout: float | None = None) -> dict[str, str]:
    results = operations.run(lab.config, ",".join(names), operation, timeout)
    failed = {r.node: r.detail for r in results if not r.ok}
    assert not failed, failed
    return {r.node: r.detail for r in results}


def test_power_off_and_status_through_both_drivers(lab):
    names = list(nodes_by_driver(lab).values())
    run(lab, names, operations.power(PowerAction.OFF))
    assert set(run(lab, names, operations.power_status).values()) == {"off"}


def test_firmware_list_shows_the_emulated_bios_version(lab):
    name = nodes_by_driver(lab)[BmcDriver.REDFISH]
    results = operations.run(lab.config, name, operations.firmware_list)
    assert results[0].ok, results[0].detail
    bios = [c["version"] for c in results[0].value if c["name"] == "BIOS"]
    assert bios and bios[0].count(".") == 2, results[0].value


def test_reprovision_boots_redfish_and_ipmi_nodes_to_ready(lab):
    names = list(nodes_by_driver(lab).values())
    results = reprovision(lab.config, names, timeout=READY_TIMEOUT)
    failed = {r.node: r.detail for r in results if not r.ok}
    assert not failed, "\n".join(f"{name}: {detail}\n{lab.serial_tail(name, 15)}"
                                  for name, detail in failed.items())
    print({r.node: f"{r.seconds:.1f} s" for r in results})
    assert set(run(lab, names, operations.power_status).values()) == {"on"}
    run(lab, names, operations.power(PowerAction.OFF))
