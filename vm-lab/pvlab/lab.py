"""The lab as one object: `up` builds it step by step (saving lab.json after each), `down`
removes exactly what lab.json names, `boot` powers domains on, `wait_ready` follows phases."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import libvirt

from provisiond.config import Config, load_config
from provisiond.states import NodePhase
from provisiond.status import clear_status, read_all_status
from pvlab import bmc, domains, libvirtd, netns, process, provision
from pvlab.errors import LabError
from pvlab.layout import (DEFAULT_DIR, DEFAULT_PLAN, SERVER_ADDRESS, LabNode, LabState,
                          load_state, plan_nodes)

LAB_FAILURES = (libvirt.libvirtError, OSError, subprocess.SubprocessError)
"""What else than a ProvisiondError a lab step can raise (reported as one line by the CLIs)."""


class Lab:
    """A lab rooted at `lab_dir`; `plan` names its nodes ('n1:bios,n2:uefi:debian12')."""

    def __init__(self, lab_dir: Path = DEFAULT_DIR, plan: str = DEFAULT_PLAN):
        self.dir = Path(lab_dir)
        self.plan = plan
        self.state = load_state(self.dir) or LabState(lab_dir=str(self.dir))

    @property
    def config(self) -> Config:
        return load_config(self.state.state_dir)

    @property
    def nodes(self) -> dict[str, LabNode]:
        return self.state.nodes

    @property
    def netns(self) -> str:
        return self.state.netns

    def up(self, serve: bool = True) -> None:
        """Bring every part up; parts already running are kept (idempotent)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # the qemu user opens files under it
        fresh = not netns.netns_exists(self.state.netns)
        if fresh:
            if self.state.netns:
                self.down()  # a half-dead lab: clear what is left before starting anew
            self.state = LabState(lab_dir=str(self.dir), netns=f"pvlab-{os.getpid()}",
                                  accel=libvirtd.probe_accel(), nodes=plan_nodes(self.plan))
        self.state.save()
        netns.create_netns(self.state.netns)
        netns.start_router_adverts(self.state)
        libvirtd.start_libvirt(self.state)
        domains.define_domains(libvirtd.connect(self.state), self.state)
        bmc.start_redfish(self.state)
        bmc.start_ipmi(self.state)
        config = provision.init_state(self.state)
        provision.register_nodes(self.state, config)
        for name in self.nodes if fresh else []:
            clear_status(config, name)  # phases of an earlier lab's boots
        if serve:
            provision.start_serve(self.state)

    def start_serve(self) -> None:
        provision.start_serve(self.state)

    def build_image(self, name: str = "tiny") -> float:
        return provision.build_image(self.state, name)

    def build_overlays(self) -> float:
        """Build every node's overlays now (needs their images built)."""
        return provision.build_overlays(self.state)

    def down(self) -> list[str]:
        """Stop and remove everything lab.json names; returns what was found still alive."""
        state = self.state
        watched = self.processes()
        provision.stop_serve(state)
        if process.alive(watched.get("libvirtd"), "libvirtd"):
            names = [node.domain for node in state.nodes.values()]
            domains.destroy_domains(libvirtd.connect(state), names)
        bmc.stop_bmcs(state)
        libvirtd.stop_libvirt(state)
        process.stop(state.pids.pop("ra", None), "pvlab.ra")
        strays = netns.pids_in_netns(state.netns)
        for pid in strays:
            process.stop(pid)
        netns.delete_netns(state.netns)
        libvirtd.remove_dirs(state)
        (state.dir / "lab.json").unlink(missing_ok=True)
        left = [f"{name} (pid {pid})" for name, pid in watched.items() if process.alive(pid)]
        left += [f"netns {state.netns}"] if netns.netns_exists(state.netns) else []
        return [f"stray pid {pid} in {state.netns} (killed)" for pid in strays] + left

    def processes(self) -> dict[str, int]:
        """Every process the lab runs: its daemons, emulators and the domains' qemu."""
        base = self.state.dir / "libvirt"
        found = {name: pid for name, pid in self.state.pids.items() if pid}
        for name in ("libvirtd", "virtlogd"):
            found[name] = process.read_pid(base / f"{name}.pid") or found.get(name, 0)
        for pid_file in (base / "run" / "qemu").glob("*.pid"):
            found[f"qemu {pid_file.stem}"] = process.read_pid(pid_file) or 0
        return {name: pid for name, pid in found.items() if process.alive(pid)}

    @property
    def redfish(self) -> tuple[str, int]:
        """(host, port) of the Redfish emulator; systems are the domains' UUIDs."""
        return bmc.BMC_HOST, self.state.redfish_port

    @property
    def ipmi(self) -> dict[str, tuple[str, int]]:
        """Node name -> (host, UDP port) of its virtualbmc IPMI endpoint."""
        return {name: (bmc.BMC_HOST, node.ipmi_port) for name, node in self.nodes.items()}

    @property
    def serve_pid(self) -> int | None:
        pid = self.state.pids.get("serve")
        return pid if process.alive(pid, "serve") else None

    @property
    def serve(self) -> dict:
        """The running `provisiond serve`: its pid, log file and URL (inside the namespace)."""
        return {"pid": self.serve_pid, "log": self.state.dir / "logs" / "serve.log",
                "url": f"http://{SERVER_ADDRESS}:{provision.HTTP_PORT}"}

    def tcp_open(self, host: str, port: int) -> bool:
        """A TCP connect to host:port from inside the lab namespace."""
        return provision.tcp_open(self.netns, host, port)

    def ssh(self, name: str, command: str, host_key: str | None = None,
            timeout: float = 20) -> subprocess.CompletedProcess:
        """Run `command` as root on a booted node over ssh (the lab's key, the node's host
        key from provisiond's ssh overlay checked, or `host_key` if given)."""
        return provision.ssh(self.state, self.config, self._node(name), command,
                             timeout=timeout, host_key=host_key)

    def boot(self, names: list[str] | None = None) -> None:
        """Power the nodes' domains on from scratch, with their boot status cleared."""
        if not netns.netns_exists(self.netns):
            raise LabError(f"the lab in {self.dir} is down; bring it up first")
        conn = libvirtd.connect(self.state)
        for name in names or list(self.nodes):
            node = self._node(name)
            clear_status(self.config, name)
            node.started = domains.start_domain(conn, node)
        self.state.save()

    def _node(self, name: str) -> LabNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise LabError(f"no lab node {name!r} (nodes: {', '.join(self.nodes)})") from None

    def wait_ready(self, names: list[str] | None = None, timeout: float = 120) -> dict[str, dict]:
        """Wait until every node reports ready (or failed, or time runs out); their statuses."""
        names = names or list(self.nodes)
        deadline = time.monotonic() + timeout
        while True:
            statuses = read_all_status(self.config)
            pending = [n for n in names if statuses.get(n, {}).get("phase") not in
                       (NodePhase.READY.value, NodePhase.FAILED.value)]
            if not pending or time.monotonic() > deadline:
                return {n: statuses.get(n, {}) for n in names}
            time.sleep(0.5)

    def phase_times(self, name: str, status: dict) -> dict[str, float]:
        """Seconds from the domain's start to each phase the node reached."""
        started = self._node(name).started
        return {phase: round(at - started, 1) for phase, at in
                sorted(status.get("phases", {}).items(), key=lambda item: item[1])}

    def serial_tail(self, name: str, lines: int = 15) -> str:
        return domains.serial_tail(self._node(name), lines)
