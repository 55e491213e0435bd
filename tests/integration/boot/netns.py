"""Two network namespaces joined by a veth pair: the server's side and a client's side."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from tests.tools import command


def ip(*args: str) -> None:
    subprocess.run(command(["ip", *args]), check=True, capture_output=True)


def in_netns(netns: str, argv: list[str]) -> list[str]:
    """`argv` run inside `netns`, both programs found by tests.tools (ip execs by PATH)."""
    return command(["ip", "netns", "exec", netns, *command(argv)])


@dataclass
class Link:
    server_ns: str
    client_ns: str
    server_if: str
    client_if: str
    server_addr: str

    def client(self, *cmd: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(in_netns(self.client_ns, list(cmd)), capture_output=True, timeout=timeout, **kw)

    def set_client_mac(self, mac: str) -> None:
        ip("-n", self.client_ns, "link", "set", self.client_if, "address", mac)

    def close(self) -> None:
        for ns in (self.client_ns, self.server_ns):
            subprocess.run(command(["ip", "netns", "del", ns]), capture_output=True)


def make_link(tag: str, server_addr: str = "10.99.0.1/16") -> Link:
    """Namespaces pvb<tag>s/pvb<tag>c; the server side gets `server_addr`."""
    suffix = f"{tag}{os.getpid() % 10000}"
    link = Link(f"pvb{suffix}s", f"pvb{suffix}c", f"vs{suffix}", f"vc{suffix}",
                server_addr.split("/")[0])
    try:
        ip("netns", "add", link.server_ns)
        ip("netns", "add", link.client_ns)
        ip("-n", link.server_ns, "link", "add", link.server_if, "type", "veth", "peer", "name",
           link.client_if, "netns", link.client_ns)
        ip("-n", link.server_ns, "addr", "add", server_addr, "dev", link.server_if)
        for ns, dev in ((link.server_ns, link.server_if), (link.client_ns, link.client_if)):
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
    except Exception:
        link.close()
        raise
    return link
