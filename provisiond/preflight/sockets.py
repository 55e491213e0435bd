"""Who holds a port: the sockets of /proc/net/{tcp,udp}[6] (this network namespace's) and
the process whose descriptors hold them."""

from __future__ import annotations

import os
from pathlib import Path

TCP_LISTEN = "0A"


def port_owner(protocol: str, port: int) -> tuple[int, list[str]] | None:
    """(pid, argv) of a process holding a `protocol` (tcp|udp) socket bound to `port`, or
    None when none is found (or their descriptors cannot be read: another user's, as non-root)."""
    inodes = _socket_inodes(protocol, port)
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _holds(proc, inodes):
            return int(proc.name), _argv(proc)
    return None


def is_provisiond_serve(argv: list[str]) -> bool:
    """Whether a process is `provisiond serve` or one of its gunicorns."""
    return ("provisiond" in argv and "serve" in argv) or any(
        word.startswith("provisiond.api:") for word in argv)


def _socket_inodes(protocol: str, port: int) -> set[str]:
    inodes = set()
    for name in (protocol, protocol + "6"):
        try:
            lines = Path("/proc/net", name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and (protocol == "udp" or fields[3] == TCP_LISTEN):
                inodes.add(fields[9])
    return inodes


def _holds(proc: Path, inodes: set[str]) -> bool:
    try:
        fds = os.listdir(proc / "fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(proc / "fd" / fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _argv(proc: Path) -> list[str]:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []
