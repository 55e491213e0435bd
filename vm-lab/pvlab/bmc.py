"""A BMC for every lab domain, on loopback outside the namespace (they reach libvirtd by its
socket): one sushy-tools Redfish emulator for all domains, and a virtualbmc IPMI endpoint
per domain under a vbmcd with its own config dir and control port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import urllib.request

from pvlab import process
from pvlab.errors import LabError
from pvlab.layout import LabState

BMC_HOST = "127.0.0.1"
BMC_USER, BMC_PASSWORD = "admin", "password"

SUSHY_CONFIG = """SUSHY_EMULATOR_LISTEN_IP = {host!r}
SUSHY_EMULATOR_LISTEN_PORT = {port}
SUSHY_EMULATOR_LIBVIRT_URI = {uri!r}
SUSHY_EMULATOR_SSL_CERT = None
SUSHY_EMULATOR_SSL_KEY = None
# Its state (sqlite) next to this file, not in the machine-wide /tmp/sushy-emulator: that one
# outlives every run, and every request of its drivers reads all of it (it had grown to 4,385
# systems and answered 45 parallel requests in minutes). Flask runs this file with __file__.
SUSHY_EMULATOR_STATE_DIR = __file__ + '.state'
SUSHY_EMULATOR_BOOT_LOADER_MAP = {{
    'UEFI': {{'x86_64': '/usr/share/OVMF/OVMF_CODE_4M.fd'}},
    'Legacy': {{'x86_64': None}},
}}
"""

VBMC_CONFIG = """[default]
config_dir = {dir}
pid_file = {dir}/vbmcd.pid
server_port = {port}
server_response_timeout = 10000
[log]
logfile = {log}
debug = false
"""


def free_port(start: int, kind: int = socket.SOCK_STREAM) -> int:
    """The first port from `start` that nothing on loopback holds (TCP or UDP)."""
    for port in range(start, start + 200):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((BMC_HOST, port))
            except OSError:
                continue
            return port
    raise LabError(f"no free port on {BMC_HOST} from {start}")


def start_redfish(state: LabState, timeout: float = 60) -> None:
    """sushy-emulator (libvirt driver) on 127.0.0.1; waits until it lists every domain."""
    if not process.alive(state.pids.get("sushy"), "sushy-emulator"):
        state.redfish_port = free_port(8000)
        config = state.dir / "bmc" / "sushy.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(SUSHY_CONFIG.format(host=BMC_HOST, port=state.redfish_port,
                                              uri=state.libvirt_uri))
        argv = ["sushy-emulator", "--config", str(config)]
        state.pids["sushy"] = process.spawn(argv, state.dir / "logs" / "sushy.log")
        state.save()
    wanted = {node.uuid for node in state.nodes.values()}
    process.wait_for(lambda: wanted <= set(redfish_systems(state)), timeout,
                     "sushy-emulator to list the lab's domains")


def redfish_systems(state: LabState) -> list[str]:
    """System ids the emulator lists (empty while it is not answering)."""
    url = f"http://{BMC_HOST}:{state.redfish_port}/redfish/v1/Systems"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            members = json.load(response)["Members"]
    except (OSError, ValueError, KeyError):
        return []
    return [m["@odata.id"].rstrip("/").rsplit("/", 1)[-1] for m in members]


def vbmc_env(state: LabState) -> dict:
    return dict(os.environ, VIRTUALBMC_CONFIG=str(state.dir / "bmc" / "virtualbmc.conf"))


def start_ipmi(state: LabState, timeout: float = 60) -> None:
    """vbmcd with a fresh config dir, then one IPMI BMC per domain on ports 6230 and up."""
    if not process.alive(state.pids.get("vbmcd"), "vbmcd"):
        vdir = state.dir / "bmc" / "vbmc"
        shutil.rmtree(vdir, ignore_errors=True)  # stale BMC entries confuse vbmcd
        vdir.mkdir(parents=True)
        state.vbmcd_port = free_port(50891)
        (state.dir / "bmc" / "virtualbmc.conf").write_text(VBMC_CONFIG.format(
            dir=vdir, port=state.vbmcd_port, log=state.dir / "logs" / "vbmcd-internal.log"))
        argv = ["vbmcd", "--foreground"]
        state.pids["vbmcd"] = process.spawn(argv, state.dir / "logs" / "vbmcd.log",
                                            env=vbmc_env(state))
        state.save()
        process.wait_for(lambda: _vbmc(state, "list", check=False).returncode == 0, timeout,
                         "vbmcd to answer")
    for node in state.nodes.values():
        _add_ipmi(state, node)
    state.save()


def _add_ipmi(state: LabState, node) -> None:
    if _vbmc(state, "show", node.domain, check=False).returncode != 0:
        node.ipmi_port = free_port(6230 + node.index - 1, socket.SOCK_DGRAM)
        _vbmc(state, "add", node.domain, "--port", str(node.ipmi_port), "--address", BMC_HOST,
              "--username", BMC_USER, "--password", BMC_PASSWORD,
              "--libvirt-uri", state.libvirt_uri)
    _vbmc(state, "start", node.domain, check=False)


def _vbmc(state: LabState, *args: str, check: bool = True):
    argv = ["vbmc", *args]
    return process.run(argv, check=check, env=vbmc_env(state), timeout=30)


def stop_bmcs(state: LabState) -> None:
    """Stop the emulators (vbmcd takes its per-domain BMC children with it)."""
    process.stop(state.pids.pop("vbmcd", None), "vbmcd")
    process.stop(state.pids.pop("sushy", None), "sushy-emulator")
