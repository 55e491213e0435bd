"""Machines provisiond does not know (discovery tests): extra libvirt domains with MACs that
no node has, defined and removed by the test that uses them, never by `Lab.up`/`down`."""

from __future__ import annotations

import re
from pathlib import Path

from pvlab import domains, libvirtd
from pvlab.errors import LabError
from pvlab.layout import LabNode, LabState

STRANGER_MAC = "52:54:00:99:78:{:02x}"


def stranger(state: LabState, index: int, vcpus: int = 1, memory_mib: int = 1024) -> LabNode:
    """A BIOS VM `pvlab-<netns>-stranger<index>` with MAC 52:54:00:99:78:<index>, defined
    (an existing definition is replaced); not in lab.json's nodes."""
    node = LabNode(name=f"stranger{index}", firmware="bios", image="", index=100 + index,
                   domain=f"{state.netns}-stranger{index}", mac=STRANGER_MAC.format(index),
                   memory_mib=memory_mib)
    node.serial_log = str(Path(state.dir) / "serial" / f"{node.name}.log")
    xml = domains.domain_xml(node, state.accel, state.dir)
    xml = re.sub(r"<vcpu>\d+</vcpu>", f"<vcpu>{vcpus}</vcpu>", xml)
    conn = libvirtd.connect(state)
    remove(state, [node])
    node.uuid = conn.defineXML(xml).UUIDString()
    return node


def defined(state: LabState, node: LabNode) -> tuple[int, int]:
    """(vCPUs, memory in MiB) as libvirt defines the domain."""
    info = libvirtd.connect(state).lookupByName(node.domain).info()
    return info[3], info[1] // 1024


def start(state: LabState, node: LabNode) -> float:
    return domains.start_domain(libvirtd.connect(state), node)


def remove(state: LabState, nodes: list[LabNode]) -> None:
    """Destroy and undefine the domains (those that exist)."""
    try:
        conn = libvirtd.connect(state)
    except LabError:  # the lab's libvirtd is gone, and its domains with it
        return
    domains.destroy_domains(conn, [node.domain for node in nodes])
