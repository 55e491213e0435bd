"""What a lab is made of and where it lives: the node plan and the state file `lab.json`.

`lab.json` records every name, port and PID the lab created, so `down` (from another
process, or after a crash) stops exactly those things and nothing else.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provisiond.atomic import write_atomic

NETWORK = "10.99.77"
SERVER_ADDRESS = f"{NETWORK}.1"
PREFIX6 = "fd99:77::"
BRIDGE = "br0"
DEFAULT_DIR = Path(os.environ.get("PVLAB_DIR", "/var/tmp/pvlab"))
DEFAULT_PLAN = "n1:bios,n2:bios,n3:uefi"


@dataclass
class LabNode:
    """One VM: its provisiond node name, libvirt domain, firmware and boot network identity."""

    name: str
    firmware: str  # bios | uefi
    image: str
    index: int
    domain: str = ""
    mac: str = ""
    ipaddr: str = ""
    uuid: str = ""
    serial_log: str = ""
    ipmi_port: int = 0
    memory_mib: int = 1024
    started: float = 0.0
    """When the domain was last powered on by the lab (epoch seconds)."""


@dataclass
class LabState:
    """Everything `up` created; saved after each step so a half-built lab can be torn down."""

    lab_dir: str
    netns: str = ""
    accel: str = "tcg"
    pids: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, LabNode] = field(default_factory=dict)
    redfish_port: int = 0
    vbmcd_port: int = 0

    @property
    def dir(self) -> Path:
        return Path(self.lab_dir)

    @property
    def state_dir(self) -> Path:
        """provisiond's state dir for this lab."""
        return self.dir / "state"

    @property
    def ssh_key(self) -> Path:
        """The lab's admin key (private); its .pub is in server.ssh_authorized_keys."""
        return self.dir / "ssh" / "id_ed25519"

    @property
    def libvirt_socket(self) -> Path:
        return self.dir / "libvirt" / "run" / "libvirt-sock"

    @property
    def libvirt_uri(self) -> str:
        return f"qemu+unix:///system?socket={self.libvirt_socket}"

    def save(self) -> None:
        data = asdict(self)
        write_atomic(self.dir / "lab.json", json.dumps(data, indent=2, sort_keys=True))


def load_state(lab_dir: Path) -> LabState | None:
    try:
        data = json.loads((lab_dir / "lab.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    nodes = {name: LabNode(**node) for name, node in data.pop("nodes", {}).items()}
    return LabState(nodes=nodes, **data)


def plan_nodes(plan: str, image: str = "tiny") -> dict[str, LabNode]:
    """'n1:bios,n2:uefi:debian12' -> nodes with MACs and addresses derived from their order."""
    nodes = {}
    for index, item in enumerate(p for p in plan.split(",") if p.strip()):
        name, firmware, *rest = (item.strip() + ("" if ":" in item else ":bios")).split(":")
        if firmware not in ("bios", "uefi"):
            raise ValueError(f"node {name}: firmware must be bios or uefi, not {firmware!r}")
        nodes[name] = LabNode(name=name, firmware=firmware, image=rest[0] if rest else image,
                              index=index + 1, domain=f"pvlab-{name}",
                              mac=f"52:54:00:99:77:{index + 1:02x}",
                              ipaddr=f"{NETWORK}.{index + 11}",
                              memory_mib=1024 if (rest or [image])[0] == "tiny" else 3072)
    return nodes
