"""Slurm's power saving programs: what `provisiond slurm resume|suspend HOSTLIST` does to
each node (the command line, logging and exit codes are in provisiond.cli.slurm).

Resume is a PXE boot: the boot device is set to PXE once, then the node is powered on, or
power cycled when it is already on (Slurm thought it down, but it runs an older boot). The
nodes' credentials end first, with every token minted until then, as for `node
reprovision`: only the new boot's agent can report (and fetch the runtime overlay) again.
A node its BMC did not boot is set DOWN with the reason (`scontrol update`), at once:
slurmctld would otherwise hold its jobs for ResumeTimeout before it gave up on the node.
Suspend is a hard power off: nodes are stateless, there is nothing to save. It runs as a
`power off` job (provisiond.cli.slurm: jobs.run_here), as `provisiond power off` does:
audited, with `job.*` events, refused (Conflict) while a node is busy in another job.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict

from provisiond.config import CONTROL_RE, Config
from provisiond.inventory.merge import Node
from provisiond.inventory.ranges import fold
from provisiond.power import operations
from provisiond.power.base import Driver
from provisiond.power.fanout import NodeResult
from provisiond.states import BootDevice, PowerAction, PowerState
from provisiond.trust import revoke


def resume(config: Config, nodes: dict[str, Node],
           timeout: float | None = None) -> list[NodeResult]:
    revoke(config, list(nodes))
    return operations.run_nodes(config, nodes, pxe_boot(config), timeout)


def pxe_boot(config: Config) -> operations.Operation:
    """Boot device PXE once, then power on, or cycle a node that is already on."""
    set_pxe = operations.boot_device(config, BootDevice.PXE)

    def operation(driver: Driver) -> str:
        detail = set_pxe(driver)
        was_on = driver.get_power_state() is PowerState.ON
        driver.set_power(PowerAction.CYCLE if was_on else PowerAction.ON)
        return f"boot {detail}, power {'cycled' if was_on else 'on'}"

    return operation


SCONTROL_TIMEOUT = 30.0
MAX_REASON = 200


def mark_down(config: Config, results: list[NodeResult]) -> list[tuple[bool, str]]:
    """Set the nodes whose resume failed DOWN in Slurm, one `scontrol update` per distinct
    reason; (ok, what happened) per call, for the log."""
    reasons: dict[str, list[str]] = defaultdict(list)
    for result in results:
        if not result.ok:
            detail = CONTROL_RE.sub(" ", result.detail).replace('"', "'")
            reasons[f"provisiond resume: {detail}"[:MAX_REASON]].append(result.node)
    return [_scontrol_down(config, fold(names), reason) for reason, names in reasons.items()]


def _scontrol_down(config: Config, names: str, reason: str) -> tuple[bool, str]:
    argv = [config.slurm.scontrol, "update", f"NodeName={names}", "State=DOWN",
            f"Reason={reason}"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{names}: cannot set DOWN: {exc}"
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return False, f"{names}: cannot set DOWN: {said[-1] if said else done.returncode}"
    return True, f"{names}: set DOWN ({reason})"
