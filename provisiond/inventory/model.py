"""The inventory schema: nodes and profiles share one record type.

Every field of a record is optional, so a profile can set a few fields and a node the rest;
`provisiond.inventory.merge` combines them into the node's effective record. The rules for
single values live in `provisiond.inventory.values`.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from provisiond.inventory.values import (IPMI_CIPHER_SUITES, MAX_BMC_TIMEOUT, OVERLAY_RE,
                                         Text, check_host, check_image_name,
                                         check_ipv4_host, check_ipv6_host, check_kernel_arg,
                                         check_name, check_node_mac, check_ssh_key,
                                         normalise_mac, normalise_netmask)
from provisiond.states import BmcDriver

__all__ = ["Inventory", "Record", "NetDev", "Bmc", "Slurm", "check_name", "normalise_mac",
           "node_sort_key"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

class NetDev(_Record):
    """One network device of a node."""

    type: Text | None = Field(None, description="ethernet, infiniband, bond...")
    mac: Text | None = None
    ipaddr: Text | None = None
    netmask: Text | None = None
    gateway: Text | None = None
    ipaddr6: Text | None = None
    prefix6: int | None = None
    mtu: int | None = None
    primary: bool | None = None

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str | None) -> str | None:
        return None if value is None else check_node_mac(value)

    @field_validator("ipaddr", "gateway")
    @classmethod
    def _ipv4(cls, value: str | None) -> str | None:
        return None if value is None else check_ipv4_host(value)

    @field_validator("netmask")
    @classmethod
    def _netmask(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return normalise_netmask(value)
        except ValueError:
            raise ValueError(f"invalid netmask {value!r}") from None

    @field_validator("ipaddr6")
    @classmethod
    def _ipv6(cls, value: str | None) -> str | None:
        return None if value is None else check_ipv6_host(value)

    @field_validator("mtu")
    @classmethod
    def _mtu(cls, value: int | None) -> int | None:
        if value is not None and not 576 <= value <= 65535:
            raise ValueError(f"mtu {value} is outside 576-65535")
        return value

    @field_validator("prefix6")
    @classmethod
    def _prefix6(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 128:
            raise ValueError(f"prefix6 {value} is outside 0-128")
        return value


class Bmc(_Record):
    """How to reach a node's BMC. The password itself lives in the secrets file."""

    driver: BmcDriver | None = None
    address: Text | None = None
    port: int | None = None
    system_id: Text | None = Field(None, description="Redfish system id; none = the only one")
    username: Text | None = None
    password_file: Text | None = Field(None, description="file holding the password")
    verify_tls: bool | None = None
    ca_file: Text | None = None
    scheme: Text | None = Field(None, description="redfish: https (default) or http")
    cipher_suite: int | None = Field(None, description="ipmi: 3 (SHA1) or 17 (SHA256)")
    timeout: float | None = None
    boot_once: bool | None = Field(None, description="false: the BMC lacks one-time boot")

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 65535:
            raise ValueError(f"port {value} is outside 1-65535")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return None if value is None else check_host(value)

    @field_validator("cipher_suite")
    @classmethod
    def _cipher_suite(cls, value: int | None) -> int | None:
        if value is not None and value not in IPMI_CIPHER_SUITES:
            raise ValueError(f"cipher suite {value} is not supported: use 3 (SHA1) or 17 "
                             "(SHA256)")
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= MAX_BMC_TIMEOUT:
            raise ValueError(f"timeout {value:g} is outside (0, {MAX_BMC_TIMEOUT:g}] seconds")
        return value

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        if value is not None and value not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, not {value!r}")
        return value


class Nomad(_Record):
    datacenter: Text | None = None
    node_class: Text | None = None
    node_pool: Text | None = None
    servers: list[Text] | None = None
    meta: dict[Text, Text] | None = None


class Ansible(_Record):
    repo: Text | None = None
    branch: Text | None = None
    playbook: Text | None = None
    extra_vars: dict[Text, Text] | None = None


class Slurm(_Record):
    """What slurm.conf says of the node (`provisiond slurm config`): unset values are left
    to Slurm's defaults. Keep them at or below what the node has (`slurmd -C` on it): a
    node that registers with fewer CPUs or less memory is drained by slurmctld."""

    cpus: int | None = Field(None, ge=1, le=1_000_000)
    sockets: int | None = Field(None, ge=1, le=65_535)
    cores_per_socket: int | None = Field(None, ge=1, le=65_535)
    threads_per_core: int | None = Field(None, ge=1, le=65_535)
    real_memory: int | None = Field(None, ge=1, le=2**40, description="MiB")
    features: list[Text] | None = None
    weight: int | None = Field(None, ge=0, le=2**32 - 2)

    @field_validator("features")
    @classmethod
    def _features(cls, value: list[str] | None) -> list[str] | None:
        for feature in value or []:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", feature):
                raise ValueError(f"invalid Slurm feature {feature!r} (letters, digits, "
                                 "'_', '.', '-')")
        return value


class Record(_Record):
    """A node or a profile: every field optional."""

    profiles: list[Text] | None = None
    comment: Text | None = None
    image: Text | None = None
    kernel_args: list[Text] | None = None
    system_overlays: list[Text] | None = None
    runtime_overlays: list[Text] | None = None
    netdevs: dict[Text, NetDev] | None = None
    bmc: Bmc | None = None
    tags: dict[Text, Text] | None = None
    ssh_authorized_keys: list[Text] | None = None
    nomad: Nomad | None = None
    ansible: Ansible | None = None
    slurm: Slurm | None = None

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            check_name(name, "profile name")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return None if value is None else check_image_name(value)

    @field_validator("kernel_args")
    @classmethod
    def _kernel_args(cls, value: list[str] | None) -> list[str] | None:
        for arg in value or []:
            check_kernel_arg(arg)
        return value

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _ssh_keys(cls, value: list[str] | None) -> list[str] | None:
        for key in value or []:
            check_ssh_key(key)
        return value

    @field_validator("system_overlays", "runtime_overlays")
    @classmethod
    def _overlays(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not OVERLAY_RE.fullmatch(name):
                raise ValueError(f"invalid overlay name {name!r}")
        return value

    @field_validator("netdevs")
    @classmethod
    def _netdev_names(cls, value: dict[str, NetDev] | None) -> dict[str, NetDev] | None:
        for name in value or {}:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}", name):
                raise ValueError(f"invalid network device name {name!r}")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
                raise ValueError(f"invalid tag name {key!r}")
        return value

    def to_data(self) -> dict:
        """The record as plain data holding only the fields that are set."""
        return self.model_dump(mode="json", exclude_none=True)


class Inventory(BaseModel):
    """Everything the inventory file holds."""

    model_config = ConfigDict(extra="forbid")

    revision: int = 0
    profiles: dict[str, Record] = {}
    nodes: dict[str, Record] = {}

    @model_validator(mode="after")
    def _names(self) -> "Inventory":
        for name in self.profiles:
            check_name(name, "profile name")
        for name in self.nodes:
            check_name(name, "node name")
        return self

    def to_data(self) -> dict:
        return {
            "revision": self.revision,
            "profiles": {k: self.profiles[k].to_data() for k in sorted(self.profiles)},
            "nodes": {k: self.nodes[k].to_data() for k in sorted(self.nodes, key=node_sort_key)},
        }


_DIGITS_RE = re.compile(r"([0-9]+)")


def node_sort_key(name: str) -> tuple:
    """Natural order: n2 before n10. Only ASCII digits count as numbers: '²' or '٣' (which
    `\\d` and str.isdigit take for digits) stay text, so any string has a key (a forged
    continue token or range holds anything)."""
    parts = _DIGITS_RE.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))
