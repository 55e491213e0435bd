"""The rules for single values of a record: names, addresses, MACs, kernel args, ssh keys,
and the control characters no string may hold. Each check returns the value (normalised)
or raises ValueError with a message fit for one line."""

from __future__ import annotations

import binascii
import functools
import ipaddress
import re
from typing import Annotated

from pydantic import StringConstraints

from provisiond.config import CONTROL_RE, CONTROLS, LABEL_RE

MAC_RE = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")
MAC_INPUT_RE = re.compile(r"^\s*[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}\s*$")  # normalise_mac's
OVERLAY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# Every string of a record is a Text: pydantic-core checks the pattern (in Rust, ~free for
# 10,000 nodes); describe_validation_error turns a mismatch into check_text's message.
Text = Annotated[str, StringConstraints(pattern=f"^[^{CONTROLS}]*$")]
HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                         r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
IPMI_PORT = 623  # RMCP+
REDFISH_PORTS = {"http": 80, "https": 443}
REDFISH_SCHEME = "https"


def bmc_port(driver, scheme: str | None, port: int | None) -> int | None:
    """The port a BMC is reached on: its own, else its driver's default (None: unknown)."""
    if port is not None:
        return port
    if driver == "ipmi":
        return IPMI_PORT
    if driver == "redfish":
        return REDFISH_PORTS.get(scheme or REDFISH_SCHEME)
    return None


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
    if not isinstance(value, str) or not LABEL_RE.fullmatch(value):
        raise ValueError(
            f"invalid {what} {value!r}: use lowercase letters, digits and '-' (a DNS label)"
        )
    return value


def check_image_name(value: str) -> str:
    """The one rule for an image name, in recipes, builds and the inventory: a DNS label (it
    names a folder, a URL path part and a field nodes are matched by)."""
    if not isinstance(value, str) or not LABEL_RE.fullmatch(value):
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
    """aa:bb:cc:dd:ee:ff from any case, ':' or '-', blanks around (MAC_INPUT_RE, which the
    OpenAPI document shows)."""
    if not MAC_INPUT_RE.fullmatch(value):
        raise ValueError(f"invalid MAC address {value!r}")
    return value.strip().lower().replace("-", ":")


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
    """A BMC address: an IP address (IPv6 compressed) or a DNS host name (lowercase), whose
    last label is not all digits (RFC 3696 section 2: what is, the resolver reads as an
    address of its own, 010.0.0.1 as 8.0.0.1)."""
    if "%" in value:
        raise ValueError(f"invalid address {value!r}: a scope id (%...) is not allowed")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if (len(value) > 253 or not HOSTNAME_RE.fullmatch(value)
            or value.rpartition(".")[2].isdigit()):  # 010.0.0.1: octal to the resolver
        raise ValueError(f"invalid address {value!r}: not an IP address or a host name")
    return value.lower()  # DNS ignores case: BMC1.lab and bmc1.lab are one BMC


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
