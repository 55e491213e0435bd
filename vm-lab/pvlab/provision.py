"""provisiond's side of the lab: its state dir and settings, the lab's nodes in its
inventory (MACs, addresses, BMCs), the image build and `provisiond serve` in the namespace."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from provisiond.config import Config, load_config
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Bmc, NetDev, Record
from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore
from pvlab import netns, process
from pvlab.bmc import BMC_HOST, BMC_PASSWORD as LAB_BMC_PASSWORD, BMC_USER
from pvlab.errors import LabError
from pvlab.layout import BRIDGE, SERVER_ADDRESS, LabNode, LabState

REPO_ROOT = Path(__file__).resolve().parents[2]  # provisiond runs from this checkout

HTTP_PORT = 9873
SETTINGS = {
    "server": {"address": SERVER_ADDRESS, "domain": "lab"},
    "http": {"enabled": True, "bind": "0.0.0.0", "port": HTTP_PORT, "workers": 2},
    "dhcp": {"enabled": True, "interface": BRIDGE, "bind": "0.0.0.0", "port": 67},
    "tftp": {"enabled": True, "bind": SERVER_ADDRESS, "port": 69},
    "dns": {"enabled": True, "bind": SERVER_ADDRESS, "port": 53},
}


def provisiond_cmd(state: LabState, *args: str) -> list[str]:
    return [sys.executable, "-m", "provisiond", "--state-dir", str(state.state_dir), *args]


def init_state(state: LabState) -> Config:
    """`provisiond init` (shipped profiles included), then the lab's boot settings."""
    process.run(provisiond_cmd(state, "init", "--address", SERVER_ADDRESS), cwd=REPO_ROOT)
    path = state.state_dir / "provisiond.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    for section, values in SETTINGS.items():
        data.setdefault(section, {}).update(values)
    extra = os.environ.get("PVLAB_OVERLAY_DIRS", "")  # site overlays to try in the lab
    data["overlay_dirs"] = [path for path in extra.split(":") if path]
    data["server"]["ssh_authorized_keys"] = [admin_key(state)]  # root's, by the ssh overlay
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(state.state_dir)


def admin_key(state: LabState) -> str:
    """The lab's ssh key pair (made once); returns the public key."""
    key = state.ssh_key
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        process.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pvlab-admin",
                     "-f", str(key)])
    return key.with_suffix(".pub").read_text().strip()


def ssh(state: LabState, config: Config, node: LabNode, command: str,
        timeout: float = 20, host_key: str | None = None) -> subprocess.CompletedProcess:
    """`command` run as root on the node over ssh from inside the namespace, with the lab's
    key, accepting only the host key provisiond's ssh overlay gave the node (or `host_key`,
    an ed25519 public key line: the one the node had before a rotation)."""
    from provisiond.overlays.hostkeys import host_key_dir

    known = state.dir / "ssh" / f"known_hosts-{node.name}"
    if host_key is None:
        host_key = (host_key_dir(config, node.name) / "ssh_host_ed25519_key.pub").read_text()
    known.write_text(f"{node.ipaddr} {' '.join(host_key.split()[:2])}\n")
    argv = ["ssh", "-i", str(state.ssh_key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
            "-o", "HostKeyAlgorithms=ssh-ed25519", "-o", "ConnectTimeout=5",
            f"root@{node.ipaddr}", command]
    return process.run(argv, netns=state.netns, check=False, timeout=timeout)


def node_record(node: LabNode, redfish_port: int) -> Record:
    """The node as provisiond sees it; odd nodes get a Redfish BMC, even ones IPMI."""
    netdev = NetDev(type="ethernet", mac=node.mac, ipaddr=node.ipaddr,
                    netmask="255.255.255.0", gateway=SERVER_ADDRESS, primary=True)
    if node.index % 2:
        bmc = Bmc(driver="redfish", address=BMC_HOST, port=redfish_port, scheme="http",
                  system_id=node.uuid, username=BMC_USER, verify_tls=False)
    else:
        bmc = Bmc(driver="ipmi", address=BMC_HOST, port=node.ipmi_port, username=BMC_USER,
                  cipher_suite=3)
    return Record(profiles=["default"], image=node.image, netdevs={"eth0": netdev}, bmc=bmc,
                  tags={"lab": "pvlab", "firmware": node.firmware},
                  comment=f"lab VM {node.domain} ({node.firmware})")


def register_nodes(state: LabState, config: Config) -> None:
    """Put every lab node in the inventory (replacing older lab records) with its password."""
    with InventoryStore(config).edit() as inventory:
        for name, record in list(inventory.nodes.items()):
            if (record.tags or {}).get("lab") == "pvlab" and name not in state.nodes:
                del inventory.nodes[name]  # a node of an earlier lab plan
        for node in state.nodes.values():
            inventory.nodes[node.name] = node_record(node, state.redfish_port)
    SecretStore(config).set("nodes", list(state.nodes), BMC_PASSWORD, LAB_BMC_PASSWORD)


def build_image(state: LabState, name: str, timeout: float = 1800) -> float:
    """`provisiond image build NAME` into the lab's state dir; returns the seconds it took."""
    return _run_logged(state, ["image", "build", name], f"image-{name}", timeout)


def build_overlays(state: LabState, timeout: float = 600) -> float:
    """`provisiond overlay build` for every node, so first boots do not wait for it."""
    return _run_logged(state, ["overlay", "build"], "overlays", timeout)


def _run_logged(state: LabState, args: list[str], name: str, timeout: float) -> float:
    started = time.monotonic()
    log = state.dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        code = subprocess.run(provisiond_cmd(state, *args), stdout=out, timeout=timeout,
                              stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                              stdin=subprocess.DEVNULL).returncode
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise LabError(f"provisiond {' '.join(args)} failed (exit {code}): {' | '.join(tail)}")
    return time.monotonic() - started


def start_serve(state: LabState, timeout: float = 60, attempts: int = 2) -> None:
    """`provisiond serve` inside the namespace; waits until its HTTP port answers there.
    A serve that dies while starting is started once more (its log says why)."""
    for attempt in range(attempts):
        if not process.alive(state.pids.get("serve"), "serve"):
            argv = provisiond_cmd(state, "serve")
            state.pids["serve"] = process.spawn(argv, state.dir / "logs" / "serve.log",
                                                netns=state.netns, cwd=REPO_ROOT)
            state.save()
        try:
            process.wait_for(lambda: serve_answers(state), timeout, "provisiond serve's HTTP port")
            return
        except LabError:
            if attempt + 1 == attempts:
                raise
            stop_session_leftovers(state, state.pids.pop("serve", 0))


def stop_session_leftovers(state: LabState, leader: int) -> None:
    """Stop what a dead serve left in its session inside the namespace (gunicorn)."""
    for pid in netns.pids_in_netns(state.netns):
        try:
            if os.getpgid(pid) == leader:
                process.stop(pid)
        except ProcessLookupError:
            continue


def serve_answers(state: LabState) -> bool:
    pid = state.pids.get("serve")
    if not process.alive(pid, "serve"):
        raise LabError(f"provisiond serve ({process.exit_status(pid)}) is not running; "
                       f"see {state.dir / 'logs' / 'serve.log'}")
    return tcp_open(state.netns, SERVER_ADDRESS, HTTP_PORT)


def tcp_open(netns: str, host: str, port: int) -> bool:
    """True if a TCP connect to host:port from inside the namespace succeeds."""
    script = f"exec 3<>/dev/tcp/{host}/{port}"
    argv = ["timeout", "3", process.tool("bash"), "-c", script]
    return process.run(argv, netns=netns, check=False).returncode == 0


def stop_serve(state: LabState) -> None:
    process.stop(state.pids.pop("serve", None), "serve", timeout=15)
