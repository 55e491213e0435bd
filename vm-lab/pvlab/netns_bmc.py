"""A Redfish BMC inside the lab namespace, for what runs there and drives power: `provisiond
serve`'s power jobs, slurmctld's ResumeProgram and SuspendProgram. The lab's own BMC
emulators (pvlab.bmc) listen on the host's loopback, which is not the namespace's."""

from __future__ import annotations

import contextlib
from pathlib import Path

from pvlab import process
from pvlab.bmc import BMC_HOST, SUSHY_CONFIG
from pvlab.layout import LabState
from pvlab.provision import tcp_open


@contextlib.contextmanager
def redfish_in_netns(state: LabState, port: int, log: Path, timeout: float = 60):
    """sushy-emulator with the lab's settings (the same libvirtd, so the same domains:
    system id = the domain's UUID) on the namespace's loopback; yields (host, port) and
    stops it by its PID afterwards. Its config file sits beside `log`."""
    config = log.with_suffix(".conf")
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(SUSHY_CONFIG.format(host=BMC_HOST, port=port, uri=state.libvirt_uri))
    pid = process.spawn([process.tool("sushy-emulator"), "--config", str(config)], log,
                        netns=state.netns)
    try:
        process.wait_for(lambda: tcp_open(state.netns, BMC_HOST, port), timeout,
                         "sushy-emulator in the lab namespace")
        yield BMC_HOST, port
    finally:
        process.stop(pid, "sushy-emulator")
