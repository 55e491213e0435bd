"""What provisiond's DHCP says to whom: reserved addresses and a boot file per client kind.

Every answer is assembled from parts computed when the table is built: the per-node options
(address, netmask, router, DNS, domain, hostname) and one boot part per client kind.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from enum import Enum

from provisiond.boot import dhcp_packet as p
from provisiond.boot.ipxe import base_url
from provisiond.boot.table import BootEntry, BootTable, SkippedRecords
from provisiond.config import Config

EFI_ARCHES = {6, 7, 9}
HTTP_ARCHES = {15, 16}


class ClientKind(str, Enum):
    """What booted software is asking, which decides the boot file."""

    BIOS = "bios"
    UEFI = "uefi"
    IPXE = "ipxe"
    HTTP = "http"


def client_kind(options: dict[int, bytes]) -> ClientKind:
    """iPXE (option 175 or user class "iPXE"), UEFI HTTP boot, UEFI PXE, else BIOS."""
    if p.OPT_IPXE in options or b"iPXE" in options.get(p.OPT_USER_CLASS, b""):
        return ClientKind.IPXE
    arch_bytes = options.get(p.OPT_ARCH, b"")
    arch = struct.unpack("!H", arch_bytes[:2])[0] if len(arch_bytes) >= 2 else 0
    if options.get(p.OPT_VENDOR_CLASS, b"").startswith(b"HTTPClient") or arch in HTTP_ARCHES:
        return ClientKind.HTTP
    return ClientKind.UEFI if arch in EFI_ARCHES else ClientKind.BIOS


@dataclass(frozen=True)
class BootPart:
    """The boot-file part of an answer for one client kind."""

    bootfile: bytes
    options: bytes


def boot_parts(config: Config, proxy: bool) -> dict[ClientKind, BootPart]:
    """One precomputed boot part per client kind."""
    base = base_url(config)
    files = {ClientKind.BIOS: "undionly.kpxe", ClientKind.UEFI: "snponly.efi",
             ClientKind.IPXE: f"{base}/boot/ipxe", ClientKind.HTTP: f"{base}/boot/files/ipxe.efi"}
    parts = {}
    for kind, name in files.items():
        opts = [(p.OPT_TFTP_SERVER, config.server.address.encode()),
                (p.OPT_BOOTFILE, name.encode())]
        if kind is ClientKind.HTTP:
            opts.append((p.OPT_VENDOR_CLASS, b"HTTPClient"))
        elif proxy:
            opts += [(p.OPT_VENDOR_CLASS, b"PXEClient"), (p.OPT_VENDOR_INFO, b"\x06\x01\x08\xff")]
        elif kind is ClientKind.IPXE:  # our offer has it all: iPXE need not wait 2 s for
            opts.append((p.OPT_IPXE, bytes((p.IPXE_NO_PXEDHCP, 1, 1))))  # ProxyDHCP offers
        parts[kind] = BootPart(name.encode(), p.encode_options(opts))
    return parts


def node_options(config: Config, entry: BootEntry) -> bytes:
    """The per-node options: server id, lease, netmask, router, DNS, domain, hostname."""
    opts = [(p.OPT_SERVER_ID, socket.inet_aton(config.server.address)),
            (p.OPT_LEASE, struct.pack("!I", config.dhcp.lease_seconds))]
    if entry.netmask:
        opts.append((p.OPT_SUBNET, socket.inet_aton(entry.netmask)))
    if entry.gateway:
        opts.append((p.OPT_ROUTER, socket.inet_aton(entry.gateway)))
    dns = dns_servers(config)
    if dns:
        opts.append((p.OPT_DNS, b"".join(socket.inet_aton(a) for a in dns)))
    opts += [(p.OPT_HOSTNAME, entry.node.encode()), (p.OPT_DOMAIN, config.server.domain.encode())]
    return p.encode_options(opts)


def pool_options(config: Config) -> bytes:
    """The options of a discovery pool lease: server id, lease, netmask, router, DNS."""
    settings = config.discovery
    opts = [(p.OPT_SERVER_ID, socket.inet_aton(config.server.address)),
            (p.OPT_LEASE, struct.pack("!I", settings.lease_seconds)),
            (p.OPT_SUBNET, socket.inet_aton(settings.netmask))]
    if settings.gateway:
        opts.append((p.OPT_ROUTER, socket.inet_aton(settings.gateway)))
    dns = dns_servers(config)
    if dns:
        opts.append((p.OPT_DNS, b"".join(socket.inet_aton(a) for a in dns)))
    return p.encode_options(opts)


def checked_options(config: Config, entry: BootEntry) -> bytes:
    """node_options, after checking what a reply packs: the addresses and the MAC."""
    for address in (entry.ipaddr, entry.netmask, entry.gateway):
        if address:  # strict: inet_aton would take "10.1" for 10.0.0.1
            ipaddress.IPv4Address(address)
    if len(bytes.fromhex(entry.mac.replace(":", ""))) != 6:
        raise ValueError(f"MAC {entry.mac!r} is not 6 bytes")
    return node_options(config, entry)


def dns_servers(config: Config) -> list[str]:
    if config.dhcp.dns_servers:
        return list(config.dhcp.dns_servers)
    return [config.server.address] if config.dns.enabled else []


class Answers:
    """Precomputed answer parts for every reserved MAC of a table."""

    def __init__(self, config: Config, table: BootTable):
        self.proxy = config.dhcp.proxy
        self.server = config.server.address
        self.server_id = p.encode_options(
            [(p.OPT_SERVER_ID, socket.inet_aton(config.server.address))])
        self.boot = boot_parts(config, self.proxy)
        self.pool_options = pool_options(config)
        self.entries: dict[str, BootEntry] = {}
        self.options: dict[str, bytes] = {}
        skipped = SkippedRecords("dhcp")
        for mac, entry in table.by_mac.items():
            answered = entry.ipaddr or self.proxy  # proxy: the other server leases addresses
            options = answered and skipped.build(
                f"node {entry.node}", lambda: checked_options(config, entry))
            if options:
                self.entries[mac], self.options[mac] = entry, options
        skipped.report()

    def reply(self, request: p.Request, msg_type: int) -> bytes:
        """The OFFER/ACK for a known MAC (proxy mode: boot information only)."""
        part = self.boot[client_kind(request.options)]
        msg = p.encode_options([(p.OPT_MSG_TYPE, bytes((msg_type,)))])
        if self.proxy:
            return p.encode_reply(request, "0.0.0.0", self.server, part.bootfile,
                                  msg + self.server_id + part.options)
        entry = self.entries[request.mac]
        return p.encode_reply(request, entry.ipaddr, self.server, part.bootfile,
                              msg + self.options[request.mac] + part.options)

    def pool_reply(self, request: p.Request, msg_type: int, address: str) -> bytes:
        """The OFFER/ACK of a discovery pool lease of `address` to an unknown MAC."""
        part = self.boot[client_kind(request.options)]
        msg = p.encode_options([(p.OPT_MSG_TYPE, bytes((msg_type,)))])
        return p.encode_reply(request, address, self.server, part.bootfile,
                              msg + self.pool_options + part.options)

    def nak(self, request: p.Request) -> bytes:
        msg = p.encode_options([(p.OPT_MSG_TYPE, bytes((p.NAK,)))])
        return p.encode_reply(request, "0.0.0.0", "0.0.0.0", b"", msg + self.server_id)
