"""Power, boot-device and firmware operations over node ranges, one result per node."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from provisiond.config import Config
from provisiond.errors import InvalidInput, NodeNotFound
from provisiond.inventory import load_nodes
from provisiond.inventory.merge import Node
from provisiond.inventory.ranges import expand, fold
from provisiond.metrics import record_outcomes
from provisiond.power import pending
from provisiond.power.base import Driver
from provisiond.power.firmware_url import (check_firmware_url, credentials_hidden,
                                          hide_credentials)
from provisiond.power.fanout import NodeResult, fan_out
from provisiond.power.settings import node_timeout, resolve_settings
from provisiond.states import BmcDriver, BootDevice, PowerAction

DRIVER_CLASSES = {
    BmcDriver.REDFISH: "provisiond.power.redfish:RedfishDriver",
    BmcDriver.IPMI: "provisiond.power.ipmi:IpmiDriver",
    BmcDriver.FAKE: "provisiond.power.fake:FakeDriver",
}
Operation = Callable[[Driver], object]
FIRMWARE_UPDATE_TIMEOUT = 1800.0  # per BMC: the BMC fetches the image and flashes it
TIMEOUT_RANGE = (0.1, 86400)
"""Seconds a --timeout (a job's `timeout`) may give: per BMC, or a reprovision's wait."""


def find_nodes(config: Config, pattern: str) -> tuple[dict[str, Node], list[str]]:
    """The inventory nodes a range names, and the names it names that are no node."""
    names = expand(pattern)
    nodes = load_nodes(config)
    return ({name: nodes[name] for name in names if name in nodes},
            [name for name in names if name not in nodes])


def select_nodes(config: Config, pattern: str) -> dict[str, Node]:
    """The inventory nodes a range names; any name missing is NodeNotFound."""
    found, missing = find_nodes(config, pattern)
    if missing:
        raise NodeNotFound(f"no such node: {fold(missing)}")
    return found


def open_driver(config: Config, node: Node, timeout: float | None = None) -> Driver:
    """The node's driver, validated (no BMC contact yet); its deadline starts now."""
    settings = resolve_settings(config, node, timeout)
    module_name, class_name = DRIVER_CLASSES[settings.driver].split(":")
    driver = getattr(importlib.import_module(module_name), class_name)(settings)
    driver.validate()
    return driver


def run(config: Config, pattern: str, operation: Operation, timeout: float | None = None,
        progress=None) -> list[NodeResult]:
    """`operation(driver)` on every node of `pattern`, fanned out with the power settings."""
    nodes = select_nodes(config, pattern)
    return run_nodes(config, nodes, operation, timeout, progress)


def run_nodes(config: Config, nodes: dict[str, Node], operation: Operation,
              timeout: float | None = None, progress=None) -> list[NodeResult]:
    """`operation` on each of `nodes`; every call's seconds and outcome are recorded
    (provisiond.metrics: provisiond_bmc_call_duration_seconds)."""
    check_timeout(timeout)

    def call(name: str):
        driver = open_driver(config, nodes[name], timeout)
        try:
            return operation(driver)
        finally:
            driver.close()

    results = fan_out(list(nodes), call,
                      lambda name: node_timeout(config, nodes[name], timeout),
                      config.power.concurrency, progress)
    record_outcomes(config, "bmc_call_duration_seconds",
                    [((_driver_name(nodes[r.node]), r.error or "ok"), r.seconds) for r in results])
    return results


def check_timeout(timeout: float | None) -> None:
    """InvalidInput for a timeout outside TIMEOUT_RANGE (NaN is outside every range)."""
    low, high = TIMEOUT_RANGE
    if timeout is not None and not low <= timeout <= high:
        raise InvalidInput(f"timeout: {timeout} is outside {low}-{high}", field="timeout")


def _driver_name(node: Node) -> str:
    bmc = node.record.bmc
    return bmc.driver.value if bmc and bmc.driver else "none"


def power(action: PowerAction) -> Operation:
    def operation(driver: Driver) -> str:
        driver.set_power(action)
        return f"{action.value} requested"

    return operation


def power_status(driver: Driver) -> str:
    return driver.get_power_state().value


def boot_device(config: Config, device: BootDevice, persistent: bool = False,
                uefi: bool | None = None) -> Operation:
    """Set the next boot device; a BMC without one-time boot gets it persistently and
    a pending reset to disk (see provisiond.power.pending)."""

    def operation(driver: Driver) -> str:
        emulate_once = not persistent and not driver.settings.boot_once
        driver.set_boot_device(device, persistent or emulate_once, uefi)
        if device is BootDevice.DISK:
            pending.clear_pending(config, driver.settings.node)
        elif emulate_once:
            pending.add_pending(config, driver.settings.node)
            return f"{device.value} persistent (no one-time boot: disk again after ready)"
        return f"{device.value} {'persistent' if persistent else 'once'}"

    return operation


def firmware_list(driver: Driver) -> list[dict]:
    return [component.to_data() for component in driver.list_firmware()]


def firmware_update(image_url: str) -> Operation:
    """Have the BMC fetch `image_url` (http or https: what SimpleUpdate is given here) and
    apply it; a URL that is neither, or holds a blank or control character, is InvalidInput
    before any BMC is contacted. The URL's password is in no result nor error: a BMC may
    quote the URL it refused or could not fetch."""
    check_firmware_url(image_url)

    def operation(driver: Driver) -> str:
        with credentials_hidden(image_url):  # the fan-out reports an error: without them
            return hide_credentials(driver.update_firmware(image_url), image_url)

    return operation


def settle_boot_device(config: Config) -> Operation:
    """Reset a pending persistent PXE override to disk when the node is ready again."""

    def operation(driver: Driver) -> str:
        node = driver.settings.node
        if not pending.due_for_reset(config, node):
            return "nothing pending" if node not in pending.read_pending(config) \
                else "pending: not ready since"
        driver.set_boot_device(BootDevice.DISK, True, None)
        pending.clear_pending(config, node)
        return "disk persistent (pending reset done)"

    return operation
