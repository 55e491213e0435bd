"""`node reprovision`: PXE once, power cycle (power on a node that is off), then wait until
each node reports `ready`. Without the wait (`wait=False`) it is Slurm's resume
(provisiond.cli.slurm): Slurm waits for the node itself.

A node counts as reprovisioned when its status (provisiond.status) says `ready` for a boot
that started after the reprovision did; `failed` from such a boot ends its wait at once.
The nodes' credentials end first, with every token minted until then: only the new boot's
agent, with a token from the new boot's script, can report again.
"""

from __future__ import annotations

import time

from provisiond.config import Config
from provisiond.inventory.ranges import fold
from provisiond.power import operations, pending
from provisiond.power.base import Driver
from provisiond.power.fanout import NodeResult
from provisiond.state.models import NodeStatus
from provisiond.states import BootDevice, NodePhase, PowerAction, PowerState
from provisiond.status import read_status
from provisiond.trust import revoke

POLL_SECONDS = 0.5
DEFAULT_TIMEOUT = 600.0


def reprovision(config: Config, names: str | list[str],
                timeout: float | None = DEFAULT_TIMEOUT, progress=None,
                wait: bool = True) -> list[NodeResult]:
    """Reboot `names` into PXE and wait up to `timeout` s for ready; one result per node.
    With `wait=False`, a result per node once its BMC took the boot (`timeout`, if given,
    then bounds each BMC's calls)."""
    pattern = names if isinstance(names, str) else fold(list(names))
    nodes = operations.select_nodes(config, pattern)
    started = time.time()
    revoke(config, list(nodes))
    if not wait:
        return operations.run_nodes(config, nodes, pxe_boot(config), timeout, progress)
    kicked = operations.run_nodes(config, nodes, pxe_boot(config))
    results = {r.node: r for r in kicked}
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    for result in kicked:
        if not result.ok and progress:
            progress(result)
    waiting = [r.node for r in kicked if r.ok]
    results.update(wait_ready(config, waiting, started, started + timeout, progress))
    for settled in _settle_ready(config, nodes, [n for n in waiting if results[n].ok]):
        results[settled.node].detail += f"; boot device reset to disk: {settled.detail}"
    return [results[name] for name in nodes]


def pxe_boot(config: Config) -> operations.Operation:
    """Boot device PXE once, then power cycle, or power on a node that is off (a cycle of
    an off node is refused by some BMCs)."""
    set_pxe = operations.boot_device(config, BootDevice.PXE)

    def operation(driver: Driver) -> str:
        detail = set_pxe(driver)
        was_on = driver.get_power_state() is not PowerState.OFF
        driver.set_power(PowerAction.CYCLE if was_on else PowerAction.ON)
        return f"boot {detail}, power {'cycled' if was_on else 'on'}"

    return operation


def wait_ready(config: Config, names: list[str], started: float, deadline: float,
               progress=None) -> dict[str, NodeResult]:
    """Poll the nodes' status files until each is ready or failed (after `started`)."""
    results: dict[str, NodeResult] = {}
    waiting = list(names)
    while waiting:
        for name in list(waiting):
            result = _boot_outcome(config, name, started)
            if result is None and time.time() >= deadline:
                result = _timed_out(config, name, started)
            if result is not None:
                waiting.remove(name)
                results[name] = result
                if progress:
                    progress(result)
        if waiting:
            time.sleep(POLL_SECONDS)
    return results


def _boot_outcome(config: Config, name: str, started: float) -> NodeResult | None:
    status = NodeStatus.of(name, read_status(config, name))
    if status.boot_started < started:
        return None
    seconds = time.time() - started
    if status.phase is NodePhase.READY:
        return NodeResult(name, True, f"ready after {seconds:.1f} s", seconds=seconds)
    if status.phase is NodePhase.FAILED:
        return NodeResult(name, False, f"boot failed: {status.detail or 'no detail'}",
                          seconds=seconds)
    return None


def _timed_out(config: Config, name: str, started: float) -> NodeResult:
    status = NodeStatus.of(name, read_status(config, name))
    reached = status.phase if status.boot_started >= started else None
    where = f"reached {reached.value}" if reached else "no boot seen"
    seconds = time.time() - started
    return NodeResult(name, False, f"not ready after {seconds:.0f} s ({where})",
                      seconds=seconds)


def _settle_ready(config: Config, nodes: dict, ready: list[str]) -> list[NodeResult]:
    """Reset the persistent PXE override of ready nodes whose BMC lacks one-time boot."""
    owed = [n for n in ready if n in pending.read_pending(config)]
    if not owed:
        return []
    return operations.run_nodes(config, {n: nodes[n] for n in owed},
                                operations.settle_boot_device(config))
