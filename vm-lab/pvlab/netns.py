"""The lab network: a namespace of the lab's own with bridge br0; nothing routes out of it."""

from __future__ import annotations

import sys
from pathlib import Path

from pvlab import process
from pvlab.layout import BRIDGE, PREFIX6, SERVER_ADDRESS, LabState

VM_LAB_DIR = Path(__file__).resolve().parent.parent


def netns_exists(name: str) -> bool:
    return bool(name) and Path(f"/run/netns/{name}").exists()


def create_netns(name: str) -> None:
    """Namespace with lo up and br0 (10.99.77.1/24, fd99:77::1/64, STP off, no delays)."""
    if netns_exists(name):
        return
    process.run(["ip", "netns", "add", name])
    for cmd in (["link", "set", "lo", "up"],
                ["link", "add", BRIDGE, "type", "bridge", "stp_state", "0",
                 "forward_delay", "0"],
                ["addr", "add", f"{SERVER_ADDRESS}/24", "dev", BRIDGE],
                ["addr", "add", f"{PREFIX6}1/64", "dev", BRIDGE, "nodad"],
                ["link", "set", BRIDGE, "up"]):
        process.run(["ip", "-n", name, *cmd])
    process.run(["sysctl", "-qw", f"net.ipv6.conf.{BRIDGE}.accept_dad=0"], netns=name)


def delete_netns(name: str) -> None:
    if netns_exists(name):
        process.run(["ip", "netns", "del", name])


def start_router_adverts(state: LabState) -> None:
    """The RA sender (pvlab.ra) inside the namespace, recorded as pids['ra']."""
    if process.alive(state.pids.get("ra"), "pvlab.ra"):
        return
    argv = [sys.executable, "-m", "pvlab.ra", BRIDGE, PREFIX6]
    state.pids["ra"] = process.spawn(argv, state.dir / "logs" / "ra.log", netns=state.netns,
                                     cwd=VM_LAB_DIR)
    state.save()


def pids_in_netns(name: str) -> list[int]:
    """PIDs of every process still inside the namespace (checked before it is deleted)."""
    if not netns_exists(name):
        return []
    out = process.run(["ip", "netns", "pids", name], check=False).stdout
    return [int(p) for p in out.split()]
