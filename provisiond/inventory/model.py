"""The inventory schema: nodes and profiles share one record type.

Every field of a record is optional, so a profile can set a few fields and a node the rest;
`provisiond.inventory.merge` combines them into the node's effective record.
"""

from __future__ import annotations

import binascii
import functools
import ipaddress
import re

from typing import Annotated

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, field_validator,
                      model_validator)

from provisiond.states import BmcDriver

NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
MAC_RE = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")
OVERLAY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# Control and format characters (C0, DEL, C1, soft hyphen, zero-width and bidi controls,
# line/paragraph separators, BOM): a value holding one can end a line of a script, a kernel
# command line or a template, or repaint a terminal.
_CONTROLS = (r"\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e"
             r"\u2060-\u206f\ufeff\ufff9-\ufffb")
CONTROL_RE = re.compile(f"[{_CONTROLS}]")
# Every string of a record is a Text: pydantic-core checks the pattern (in Rust, ~free for
# 10,000 nodes); describe_validation_error turns a mismatch into check_text's message.
Text = Annotated[str, StringConstraints(pattern=f"^[^{_CONTROLS}]*$")]
HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                         r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
IPMI_CIPHER_SUITES = (3, 17)  # what pyghmi offers: 3 = RAKP-HMAC-SHA1, 17 = SHA256
MAX_BMC_TIMEOUT = 600.0
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052


def check_text(value: str) -> str:
    """Refuse control and format characters in a string that may reach a script, a kernel
    command line, a template or a terminal."""
    found = CONTROL_RE.search(value)
    if found:
        raise ValueError(f"control character {found.group()!r} is not allowed in {value!r}")
    return value


def check_name(value: str, what: str = "name") -> str:
    """A node, profile or image name must be a valid lowercase DNS label."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid {what} {value!r}: use lowercase letters, digits and '-' (a DNS label)"
        )
    return value


def check_image_name(value: str) -> str:
    """The one rule for an image name, in recipes, builds and the inventory: a DNS label (it
    names a folder, a URL path part and a field nodes are matched by)."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ValueError(f"not an image name: {value!r}: use lowercase letters, digits and "
                         "'-' (a DNS label)")
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
    if not MAC_RE.fullmatch(mac):
        raise ValueError(f"invalid MAC address {value!r}")
    return mac


def check_node_mac(value: str) -> str:
    """A MAC a network card can have: not all zeros, not broadcast, not multicast."""
    mac = normalise_mac(value)
    if mac == "00:00:00:00:00:00":
        raise ValueError(f"{mac} is not a MAC a device can have (all zeros)")
    if int(mac[:2], 16) & 1:
        kind = "broadcast" if mac == "ff:ff:ff:ff:ff:ff" else "multicast"
        raise ValueError(f"{mac} is a {kind} MAC address, not a device's")
    return mac


def check_ipv4_host(value: str) -> str:
    """An IPv4 address a node can have: not 0.0.0.0, multicast or broadcast. (Loopback is a
    node's address only beside a loopback server: see validate_inventory.)"""
    if not is_ipv4(value):
        raise ValueError(f"invalid IPv4 address {value!r}")
    first = int(value.partition(".")[0])  # string checks: ipaddress is slow for 10,000 nodes
    for bad, why in ((value == "0.0.0.0", "unspecified"), (224 <= first <= 239, "multicast"),
                     (value == "255.255.255.255", "the broadcast address")):
        if bad:
            raise ValueError(f"{value} is {why}, not a node's address")
    return value


def check_ipv6_host(value: str) -> str:
    """An IPv6 address a node can have, in compressed form. Refused: scope ids (`%eth0` can
    carry any text), IPv4-mapped and NAT64 forms (an IPv4 node is named by ipaddr),
    unspecified and multicast. (Loopback: see validate_inventory.)"""
    if not isinstance(value, str) or "%" in value:
        raise ValueError(f"invalid IPv6 address {value!r}: a scope id (%...) is not allowed")
    try:
        address = ipaddress.IPv6Address(value)
    except ValueError:
        raise ValueError(f"invalid IPv6 address {value!r}") from None
    for bad, why in ((address.ipv4_mapped is not None, "an IPv4-mapped address"),
                     (address in NAT64_WELL_KNOWN, "a NAT64 (64:ff9b::/96) address"),
                     (address.is_unspecified, "unspecified"),
                     (address.is_multicast, "multicast")):
        if bad:
            raise ValueError(f"{value} is {why}, not a node's address")
    return str(address)


def check_host(value: str) -> str:
    """A BMC address: an IP address (IPv6 compressed) or a DNS host name."""
    if "%" in value:
        raise ValueError(f"invalid address {value!r}: a scope id (%...) is not allowed")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if len(value) > 253 or not HOSTNAME_RE.fullmatch(value):
        raise ValueError(f"invalid address {value!r}: not an IP address or a host name")
    return value


def check_kernel_arg(value: str) -> str:
    """One kernel command-line word: no whitespace (it would be several), no controls."""
    check_text(value)
    if not value or re.search(r"\s", value):
        raise ValueError(f"invalid kernel argument {value!r}: one argument, no whitespace")
    return value


SSH_KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"})
_SSH_OPTIONS_RE = re.compile(r'(?:[^\s"]|"(?:[^"\\]|\\.)*")+')
_BASE64_RE = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def check_ssh_key(value: str) -> str:
    """An OpenSSH authorized_keys line: [options] type base64 [comment], where the base64
    blob starts with the same type name (sshd's format; see sshd(8) AUTHORIZED_KEYS)."""
    check_text(value)
    rest = value.strip()
    if rest.split(" ", 1)[0] not in SSH_KEY_TYPES:
        options = _SSH_OPTIONS_RE.match(rest)
        rest = rest[options.end():].lstrip() if options else rest
    parts = rest.split(None, 2)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise ValueError(f"not an OpenSSH public key: {_preview(value)} (expected "
                         "'[options] TYPE BASE64 [comment]', TYPE such as ssh-ed25519)")
    if _blob_type(parts[1]) != parts[0]:
        raise ValueError(f"not an OpenSSH public key: {_preview(value)} (the base64 part "
                         f"is not a {parts[0]} key)")
    return value


def _blob_type(blob: str) -> str | None:
    """The key type named at the start of a public key blob (uint32 length, then the name).
    Only the head is decoded: it is what tells a key of another type or a pasted fragment."""
    if not _BASE64_RE.fullmatch(blob) or len(blob) < 8:
        return None
    head = binascii.a2b_base64(blob[:len(blob) // 4 * 4][:64])
    size = int.from_bytes(head[:4], "big")
    return head[4:4 + size].decode("ascii", "replace") if 0 < size <= 40 else None


def _preview(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")


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


def node_sort_key(name: str) -> tuple:
    """Natural order: n2 before n10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
