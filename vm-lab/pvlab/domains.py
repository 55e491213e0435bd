"""The lab's libvirt domains: network boot first, serial console logged to a file,
SeaBIOS + the NIC's iPXE ROM (bios) or OVMF (uefi)."""

from __future__ import annotations

import time
from pathlib import Path
from xml.sax.saxutils import escape

import libvirt

from pvlab.layout import BRIDGE, LabNode, LabState

OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
NIC_MODEL = "e1000"  # downloads faster than virtio-net under TCG (LAB.md)

DOMAIN_XML = """<domain type='{accel}'>
  <name>{name}</name>
  <memory unit='MiB'>{memory}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='{machine}'>hvm</type>
    {firmware}
    <boot dev='network'/>
    <bios useserial='yes'/>
  </os>
  <features><acpi/><apic/></features>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <interface type='bridge'>
      <source bridge='{bridge}'/>
      <mac address='{mac}'/>
      <model type='{nic}'/>
    </interface>
    <serial type='pty'>
      <log file='{serial_log}' append='off'/>
      <target port='0'/>
    </serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <memballoon model='none'/>
  </devices>
</domain>
"""

UEFI_FIRMWARE = """<loader readonly='yes' type='pflash'>{code}</loader>
    <nvram template='{vars}'>{nvram}</nvram>"""


def domain_xml(node: LabNode, accel: str, lab_dir: Path) -> str:
    firmware = ""
    if node.firmware == "uefi":
        nvram = lab_dir / "nvram" / f"{node.domain}_VARS.fd"
        firmware = UEFI_FIRMWARE.format(code=OVMF_CODE, vars=OVMF_VARS, nvram=nvram)
    return DOMAIN_XML.format(
        accel="kvm" if accel == "kvm" else "qemu", name=escape(node.domain), memory=node.memory_mib,
        machine="q35" if node.firmware == "uefi" else "pc", firmware=firmware,
        bridge=BRIDGE, mac=node.mac, nic=NIC_MODEL, serial_log=escape(node.serial_log))


def define_domains(conn: libvirt.virConnect, state: LabState) -> None:
    """Define each node's domain (idempotent); records UUID and serial log path."""
    (state.dir / "serial").mkdir(parents=True, exist_ok=True)
    (state.dir / "nvram").mkdir(parents=True, exist_ok=True)
    existing = set(conn.listDefinedDomains()) | {d.name() for d in conn.listAllDomains()}
    for node in state.nodes.values():
        node.serial_log = str(state.dir / "serial" / f"{node.name}.log")
        if node.domain not in existing:
            conn.defineXML(domain_xml(node, state.accel, state.dir))
        node.uuid = conn.lookupByName(node.domain).UUIDString()
    state.save()


def start_domain(conn: libvirt.virConnect, node: LabNode) -> float:
    """Power the domain on from scratch (destroying a running one); returns the start time."""
    dom = conn.lookupByName(node.domain)
    if dom.isActive():
        dom.destroy()
    Path(node.serial_log).unlink(missing_ok=True)
    started = time.time()
    dom.create()
    return started


def destroy_domains(conn: libvirt.virConnect, names: list[str]) -> None:
    """Destroy and undefine (with NVRAM) every named domain that exists."""
    for name in names:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            continue
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


def running_domains(conn: libvirt.virConnect) -> list[str]:
    return [d.name() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)]


def serial_tail(node: LabNode, lines: int = 15) -> str:
    """The last lines of the node's serial console, control characters dropped."""
    try:
        text = Path(node.serial_log).read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return "(no serial output)"
    clean = "".join(c for c in text if c.isprintable() or c == "\n")
    return "\n".join(clean.replace("\r", "").splitlines()[-lines:])
