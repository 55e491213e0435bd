"""Slurm's power saving programs: what `provisiond slurm resume|suspend HOSTLIST` does to
each node (the command line, logging and exit codes are in provisiond.cli.slurm).

Resume is a PXE boot: the boot device is set to PXE once, then the node is powered on, or
power cycled when it is already on (Slurm thought it down, but it runs an older boot). The
nodes' credentials end first, with every token minted until then, as for `node
reprovision`: only the new boot's agent can report (and fetch the runtime overlay) again.
Suspend is a hard power off: nodes are stateless, there is nothing to save. It runs as a
`power off` job (provisiond.jobs.run_here), as `provisiond power off` does: audited, with
`job.*` events, and refused (Conflict) while a node is busy in another job (a reprovision).
"""

from __future__ import annotations

from provisiond import jobs
from provisiond.config import Config
from provisiond.inventory.merge import Node
from provisiond.power import operations
from provisiond.power.base import Driver
from provisiond.power.fanout import NodeResult
from provisiond.inventory.ranges import fold
from provisiond.jobs.model import Job
from provisiond.states import BootDevice, JobKind, PowerAction, PowerState
from provisiond.trust import revoke


def resume(config: Config, nodes: dict[str, Node],
           timeout: float | None = None) -> list[NodeResult]:
    revoke(config, list(nodes))
    return operations.run_nodes(config, nodes, pxe_boot(config), timeout)


def suspend(config: Config, nodes: dict[str, Node], timeout: float | None,
            actor: str) -> Job | None:
    """The ended `power off` job of `nodes` (None when there is none)."""
    if not nodes:
        return None
    return jobs.run_here(config, JobKind.POWER, [fold(list(nodes))],
                         {"action": PowerAction.OFF.value, "timeout": timeout}, actor)


def pxe_boot(config: Config) -> operations.Operation:
    """Boot device PXE once, then power on, or cycle a node that is already on."""
    set_pxe = operations.boot_device(config, BootDevice.PXE)

    def operation(driver: Driver) -> str:
        detail = set_pxe(driver)
        was_on = driver.get_power_state() is PowerState.ON
        driver.set_power(PowerAction.CYCLE if was_on else PowerAction.ON)
        return f"boot {detail}, power {'cycled' if was_on else 'on'}"

    return operation
