"""Two boot segments and a store network, in network namespaces a test creates, for several
`provisiond serve` on one etcd cluster:

    core (bridge, 10.96.0.1: the etcd members)
     |-- server a (10.96.0.11) -- segment a (10.91.0.0/24) -- node a
     |-- server b (10.96.0.12) -- segment b (10.92.0.0/24) -- node b

The test process reaches any of them from a thread that entered the namespace (setns is per
thread; a process such a thread starts runs there too): `Namespace.run(fn, ...)`.
Everything is removed by `close()` (namespaces by name, which the test made unique).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.etcd_cluster import EtcdCluster, Member
from tests.tools import command

CLONE_NEWNET = 0x40000000
CORE_ADDRESS = "10.96.0.1"
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def ip(*args: str) -> None:
    subprocess.run(command(["ip", *args]), check=True, capture_output=True, timeout=30)


def enter(netns: str) -> None:
    """Move the calling thread into `netns` (for a ThreadPoolExecutor's initializer)."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)


@dataclass
class Namespace:
    name: str
    threads: int = 4
    pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def run(self, fn, *args, timeout: float = 120, **kwargs):
        """fn(*args, **kwargs) in a thread of this namespace; its result or its exception."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name,
                                           initializer=enter, initargs=(self.name,))
        return self.pool.submit(fn, *args, **kwargs).result(timeout)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        subprocess.run(command(["ip", "netns", "del", self.name]), capture_output=True)


@dataclass
class Segment:
    """One boot server's namespace, its boot segment and a node's namespace on it."""

    server: Namespace
    node: Namespace
    store_address: str  # the server's address on the core network
    server_address: str  # on its segment
    server_if: str
    node_if: str


class Segments:
    def __init__(self, tag: str):
        suffix = f"{tag}{os.getpid() % 10000}"
        self.core = Namespace(f"pvm{suffix}k", threads=24)
        self.bridge = f"br{suffix}"
        self.segments: list[Segment] = []
        self._made: list[Namespace] = []
        try:
            self._make_core()
            for index, letter in enumerate("ab"):
                self.segments.append(self._make_segment(suffix, letter, index))
        except Exception:
            self.close()
            raise

    def _namespace(self, name: str, threads: int = 4) -> Namespace:
        ip("netns", "add", name)
        space = Namespace(name, threads)
        self._made.append(space)
        ip("-n", name, "link", "set", "lo", "up")
        return space

    def _make_core(self) -> None:
        self._namespace(self.core.name)
        self._made[-1] = self.core
        ip("-n", self.core.name, "link", "add", self.bridge, "type", "bridge")
        ip("-n", self.core.name, "addr", "add", f"{CORE_ADDRESS}/24", "dev", self.bridge)
        ip("-n", self.core.name, "link", "set", self.bridge, "up")

    def _make_segment(self, suffix: str, letter: str, index: int) -> Segment:
        server = self._namespace(f"pvm{suffix}{letter}")
        node = self._namespace(f"pvm{suffix}{letter}n")
        uplink, port = f"u{letter}{suffix}", f"p{letter}{suffix}"
        ip("-n", server.name, "link", "add", uplink, "type", "veth", "peer", "name", port,
           "netns", self.core.name)
        ip("-n", self.core.name, "link", "set", port, "master", self.bridge)
        ip("-n", self.core.name, "link", "set", port, "up")
        store_address = f"10.96.0.{11 + index}"
        ip("-n", server.name, "addr", "add", f"{store_address}/24", "dev", uplink)
        ip("-n", server.name, "link", "set", uplink, "up")
        server_if, node_if = f"s{letter}{suffix}", f"n{letter}{suffix}"
        ip("-n", server.name, "link", "add", server_if, "type", "veth", "peer", "name",
           node_if, "netns", node.name)
        server_address = f"10.9{1 + index}.0.1"
        ip("-n", server.name, "addr", "add", f"{server_address}/24", "dev", server_if)
        ip("-n", server.name, "link", "set", server_if, "up")
        ip("-n", node.name, "link", "set", node_if, "up")
        return Segment(server, node, store_address, server_address, server_if, node_if)

    def close(self) -> None:
        for space in reversed(self._made):
            space.close()


@dataclass
class CoreMember(Member):
    host: str = CORE_ADDRESS

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


class CoreCluster(EtcdCluster):
    """tests.etcd_cluster's cluster with its members on the core network's address: start,
    stop and ask it from a thread of the core namespace (`core.run(cluster.start)`), whose
    members then run there (and die with that thread's process)."""

    def __init__(self, base, host: str = CORE_ADDRESS):
        super().__init__(base)
        self.members = [CoreMember(m.name, m.client_port, m.peer_port, m.data_dir, host=host)
                        for m in self.members]

    def _flags(self, member, state: str) -> list[str]:
        return [flag.replace("http://127.0.0.1:", f"http://{member.host}:")
                for flag in super()._flags(member, state)]
