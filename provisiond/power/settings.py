"""A node's BMC settings from the inventory, the secrets store and the power config."""

from __future__ import annotations

from provisiond.config import Config
from provisiond.errors import InvalidInput
from provisiond.inventory.merge import Node
from provisiond.inventory.secrets import bmc_password
from provisiond.power.base import BmcSettings


def resolve_settings(config: Config, node: Node, timeout: float | None = None) -> BmcSettings:
    """The node's BmcSettings; `timeout` (from --timeout) wins over bmc.timeout and config."""
    bmc = node.record.bmc
    if bmc is None or bmc.driver is None:
        raise InvalidInput(f"node {node.name}: bmc.driver is not set")
    return BmcSettings(
        node=node.name,
        driver=bmc.driver,
        address=bmc.address,
        port=bmc.port,
        system_id=bmc.system_id,
        username=bmc.username,
        password=bmc_password(config, node),
        verify_tls=True if bmc.verify_tls is None else bmc.verify_tls,
        ca_file=bmc.ca_file,
        scheme=bmc.scheme or "https",
        cipher_suite=bmc.cipher_suite,
        timeout=node_timeout(config, node, timeout),
        boot_once=True if bmc.boot_once is None else bmc.boot_once,
        state_dir=str(config.state_dir),
    )


def node_timeout(config: Config, node: Node, override: float | None = None) -> float:
    """Seconds allowed per BMC call: --timeout, else bmc.timeout, else power.timeout."""
    bmc = node.record.bmc
    return override or (bmc.timeout if bmc else None) or config.power.timeout
