"""Real VMs PXE-boot through provisiond (DHCP, iPXE script, blobs, overlays) to `ready`:
4 VMs at once (3 BIOS + 1 UEFI) with the tiny image. The debian12 VM n4, and root's ssh login
to it, are in test_mounted_layers_lab.py (both boot modes) and test_trust_lab.py. The first
tests check the lab's own logic (domain XML, node plan, router advertisement) without VMs."""

from __future__ import annotations

import time
from xml.etree import ElementTree

import pytest

from provisiond.states import NodePhase
from pvlab import domains, report
from pvlab.layout import plan_nodes
from pvlab.ra import advertisement

TINY_NODES = ["n1", "n2", "n3", "n5"]  # bios, bios, uefi, bios in the fixture's plan
ORDER = ["dhcp", "ipxe", "kernel", "booted", "runtime", "ready"]


def boot_to_ready(lab, names: list[str], timeout: float) -> dict[str, dict]:
    """Boot the nodes, wait, print the phase table; fail with the serial tails if needed."""
    lab.boot(names)
    statuses = lab.wait_ready(names, timeout)
    print("\n" + report.format_table(report.status_rows(lab, statuses)))
    not_ready = {n: s.get("phase") for n, s in statuses.items() if s.get("phase") != "ready"}
    assert not not_ready, f"{not_ready}\n{report.failure_report(lab, statuses)}"
    return statuses


def test_domain_xml_boots_from_the_network_with_the_right_firmware(tmp_path):
    nodes = plan_nodes("a:bios,b:uefi:debian12")
    bios = ElementTree.fromstring(domains.domain_xml(nodes["a"], "tcg", tmp_path))
    uefi = ElementTree.fromstring(domains.domain_xml(nodes["b"], "kvm", tmp_path))
    assert bios.get("type") == "qemu" and uefi.get("type") == "kvm"
    assert bios.find("os/boot").get("dev") == "network" and bios.find("os/loader") is None
    assert uefi.find("os/loader").text == domains.OVMF_CODE
    assert uefi.find("devices/interface/mac").get("address") == "52:54:00:99:77:02"
    assert (nodes["b"].image, nodes["b"].ipaddr, nodes["b"].memory_mib) == (
        "debian12", "10.99.77.12", 3072)


def test_router_advertisement_is_a_prefix_only_ra():
    message = advertisement("fd99:77::", bytes(6))
    assert message[0] == 134 and message[5] == 0  # RA, M and O flags clear
    assert message[6:8] == b"\0\0"  # router lifetime 0: not a default router
    assert message[16:18] == bytes([3, 4]) and message[18] == 64  # a /64 prefix option


def _wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


@pytest.mark.lab
def test_lab_network_stays_inside_its_namespace(lab):
    routes = lab.tcp_open("10.99.77.1", 9873), _routes(lab)
    assert routes[0], "provisiond serve's HTTP port is not reachable inside the namespace"
    assert routes[1] == ["10.99.77.0/24"], f"lab namespace routes: {routes[1]}"


def _routes(lab) -> list[str]:
    from pvlab import process

    out = process.run(["ip", "-4", "route", "show"], netns=lab.netns).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@pytest.mark.lab
def test_four_vms_at_once_three_bios_one_uefi_boot_the_tiny_image_to_ready(lab):
    statuses = boot_to_ready(lab, TINY_NODES, timeout=480)  # TCG on 2 shared cores
    for name in TINY_NODES:
        times = lab.phase_times(name, statuses[name])
        assert [p for p in ORDER if p in times] == ORDER, times
        assert sorted(times.values()) == [times[p] for p in ORDER], times
        serial = open(lab.nodes[name].serial_log, errors="replace").read()
        assert f"{lab.nodes[name].ipaddr}/255.255.255.0" in serial  # the reserved address
        assert "provisiond-init: switching root to" in serial
    assert {lab.nodes[n].firmware for n in TINY_NODES} == {"bios", "uefi"}
