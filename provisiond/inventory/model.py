"""The inventory schema: nodes and profiles share one record type.

Every field of a record is optional, so a profile can set a few fields and a node the rest;
`provisiond.inventory.merge` combines them into the node's effective record.
"""

from __future__ import annotations

import functools
import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from provisiond.states import BmcDriver

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAC_RE = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
OVERLAY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_name(value: str, what: str = "name") -> str:
    """A node or profile name must be a valid lowercase DNS label."""
    if not NAME_RE.match(value):
        raise ValueError(
            f"invalid {what} {value!r}: use lowercase letters, digits and '-' (a DNS label)"
        )
    return value


_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4_RE = re.compile(rf"^{_OCTET}(\.{_OCTET}){{3}}$")


def is_ipv4(value: str) -> bool:
    """A dotted quad without leading zeros: what ipaddress accepts, one regex match."""
    return IPV4_RE.fullmatch(value) is not None


@functools.lru_cache(maxsize=64)
def normalise_netmask(value: str) -> str:
    return str(ipaddress.IPv4Network(f"0.0.0.0/{value}").netmask)


def normalise_mac(value: str) -> str:
    mac = value.strip().lower().replace("-", ":")
    if not MAC_RE.match(mac):
        raise ValueError(f"invalid MAC address {value!r}")
    return mac


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class NetDev(_Record):
    """One network device of a node."""

    type: str | None = Field(None, description="ethernet, infiniband, bond...")
    mac: str | None = None
    ipaddr: str | None = None
    netmask: str | None = None
    gateway: str | None = None
    ipaddr6: str | None = None
    prefix6: int | None = None
    mtu: int | None = None
    primary: bool | None = None

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str | None) -> str | None:
        return None if value is None else normalise_mac(value)

    @field_validator("ipaddr", "gateway")
    @classmethod
    def _ipv4(cls, value: str | None) -> str | None:
        if value is not None and not is_ipv4(value):
            raise ValueError(f"invalid IPv4 address {value!r}")
        return value

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
        if value is not None:
            try:
                ipaddress.IPv6Address(value)
            except ValueError:
                raise ValueError(f"invalid IPv6 address {value!r}") from None
        return value

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
    address: str | None = None
    port: int | None = None
    system_id: str | None = Field(None, description="Redfish system id; none = the only one")
    username: str | None = None
    password_file: str | None = Field(None, description="file holding the password")
    verify_tls: bool | None = None
    ca_file: str | None = None
    scheme: str | None = Field(None, description="redfish: https (default) or http")
    cipher_suite: int | None = Field(None, description="ipmi: 3 (SHA1) or 17 (SHA256)")
    timeout: float | None = None
    boot_once: bool | None = Field(None, description="false: the BMC lacks one-time boot")

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 65535:
            raise ValueError(f"port {value} is outside 1-65535")
        return value

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        if value is not None and value not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, not {value!r}")
        return value


class Nomad(_Record):
    datacenter: str | None = None
    node_class: str | None = None
    node_pool: str | None = None
    servers: list[str] | None = None
    meta: dict[str, str] | None = None


class Ansible(_Record):
    repo: str | None = None
    branch: str | None = None
    playbook: str | None = None
    extra_vars: dict[str, str] | None = None


class Record(_Record):
    """A node or a profile: every field optional."""

    profiles: list[str] | None = None
    comment: str | None = None
    image: str | None = None
    kernel_args: list[str] | None = None
    system_overlays: list[str] | None = None
    runtime_overlays: list[str] | None = None
    netdevs: dict[str, NetDev] | None = None
    bmc: Bmc | None = None
    tags: dict[str, str] | None = None
    ssh_authorized_keys: list[str] | None = None
    nomad: Nomad | None = None
    ansible: Ansible | None = None

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            check_name(name, "profile name")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "image name")

    @field_validator("system_overlays", "runtime_overlays")
    @classmethod
    def _overlays(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not OVERLAY_RE.match(name):
                raise ValueError(f"invalid overlay name {name!r}")
        return value

    @field_validator("netdevs")
    @classmethod
    def _netdev_names(cls, value: dict[str, NetDev] | None) -> dict[str, NetDev] | None:
        for name in value or {}:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$", name):
                raise ValueError(f"invalid network device name {name!r}")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            if not re.match(r"^[A-Za-z0-9_.-]+$", key):
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


def node_sort_key(name: str) -> tuple:
    """Natural order: n2 before n10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
