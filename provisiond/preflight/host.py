"""The head node's checks: settings, the listeners' addresses and ports, the DHCP
interface, the iPXE binaries, and who owns the state directory."""

from __future__ import annotations

import errno
import ipaddress
import os
import platform
import socket
from pathlib import Path

from provisiond.boot.supervisor import enabled_services, service_sockets
from provisiond.config import Config, check_serving, service_paths, url_host
from provisiond.errors import InvalidConfig
from provisiond.preflight import Finding, fail, ok, warn
from provisiond.preflight.sockets import is_provisiond_serve, port_owner
from provisiond.state.layout import Layout

IPXE_FILES = ("undionly.kpxe", "snponly.efi", "ipxe.efi")  # BIOS, UEFI, UEFI HTTP boot
SHOWN = 3  # paths named in one finding


def check_host(config: Config) -> list[Finding]:
    return [*check_settings(config), *check_listeners(config), *check_interface(config),
            *check_ipxe(config), *check_state_dir(config)]


def check_settings(config: Config) -> list[Finding]:
    path = str(Layout.of(config).settings)
    try:
        check_serving(config, enabled_services(config))
    except InvalidConfig as exc:
        return [fail("settings", path, str(exc), "fix it in provisiond.yaml")]
    findings = [ok("settings", path, "loaded; " + ", ".join(
        name for name, on in enabled_services(config).items() if on) + " enabled")]
    address = config.server.address
    if not _is_local(address):
        findings.append(warn("settings", "server.address", f"{address} is not an address of "
                             "this host: nodes are sent there", "set server.address to this "
                             "host's boot network address (unless a NAT or a proxy forwards)"))
    return findings


def check_listeners(config: Config) -> list[Finding]:
    return [_check_listener(*socket_) for socket_ in
            service_sockets(config, enabled_services(config))]


def _check_listener(service: str, protocol: str, bind: str, port: int) -> Finding:
    subject = f"{service} {protocol} {url_host(bind)}:{port}"
    if not ipaddress.ip_address(bind).is_unspecified and not _is_local(bind):
        return fail("listener", subject, f"{bind} is not an address of this host",
                    f"set {service}.bind to one of this host's addresses (ip -br addr)")
    try:
        _probe(protocol, bind, port)
    except PermissionError:
        return warn("listener", subject, "not tested: a port below 1024 needs root or "
                    "CAP_NET_BIND_SERVICE", "run provisiond doctor as root")
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return fail("listener", subject, exc.strerror or str(exc), f"check {service}.bind")
        return _in_use(service, subject, protocol, port)
    return ok("listener", subject, "free")


def _in_use(service: str, subject: str, protocol: str, port: int) -> Finding:
    owner = port_owner(protocol, port)
    if owner and is_provisiond_serve(owner[1]):
        return ok("listener", subject, f"in use by provisiond serve (pid {owner[0]})")
    holder = f"{os.path.basename(owner[1][0]) if owner[1] else '?'} (pid {owner[0]})" \
        if owner else "another program"
    return fail("listener", subject, f"port {port} is in use by {holder}",
                f"stop it (ss -lnp 'sport = :{port}'), or set {service}.port")


def _probe(protocol: str, bind: str, port: int) -> None:
    """Bind without SO_REUSEADDR and let go: in use, not ours, not allowed all raise."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as sock:
        sock.bind((bind, port))


def _is_local(address: str) -> bool:
    """Whether `address` is one of this host's (in this network namespace)."""
    try:
        _probe("udp", address, 0)
    except OSError as exc:
        return exc.errno != errno.EADDRNOTAVAIL
    return True


def check_interface(config: Config) -> list[Finding]:
    name = config.dhcp.interface
    if not config.dhcp.enabled or name is None:
        return []
    present = sorted(p.name for p in Path("/sys/class/net").iterdir())
    if name not in present:
        return [fail("interface", name, "no such network interface: dhcp.interface",
                     f"set dhcp.interface to one of: {', '.join(present)}")]
    findings = [ok("interface", name, "present")]
    if _kernel() < (5, 7):  # SO_BINDTODEVICE needed CAP_NET_RAW before Linux 5.7
        findings.append(warn("interface", name, f"kernel {platform.release()}: pinning DHCP "
                             "to an interface needs CAP_NET_RAW", "add CAP_NET_RAW to "
                             "AmbientCapabilities and CapabilityBoundingSet of the unit"))
    return findings


def _kernel() -> tuple[int, int]:
    parts = platform.release().split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def check_ipxe(config: Config) -> list[Finding]:
    """The iPXE binaries DHCP names and TFTP (and /boot/files) serves."""
    if not (config.tftp.enabled or config.dhcp.enabled):
        return []
    root = Path(config.tftp.root)
    missing = [name for name in IPXE_FILES if not os.access(root / name, os.R_OK)]
    if missing:
        return [fail("ipxe", str(root), f"missing or unreadable: {', '.join(missing)}",
                     "install Debian's ipxe package, or set tftp.root")]
    return [ok("ipxe", str(root), ", ".join(IPXE_FILES))]


def check_state_dir(config: Config) -> list[Finding]:
    """A service user owns the state dir: what it must write (status, overlay builds, the
    journal) must be theirs; root's image layer trees under cache/ excepted."""
    state = config.state_dir
    owner = state.stat().st_uid
    if owner == 0:
        return [ok("state-dir", str(state), "owned by root (serve runs as root)")]
    foreign = [path for path in service_paths(state) if _uid(path) not in (owner, None)]
    if foreign:
        return [fail("state-dir", str(state), f"{len(foreign)} path(s) not owned by uid "
                     f"{owner}, the service's user: {', '.join(foreign[:SHOWN])}",
                     f"chown them to uid {owner} (provisiond run as root does this itself)")]
    return [ok("state-dir", str(state), f"owned by uid {owner}")]


def _uid(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return None
