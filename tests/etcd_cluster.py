"""A real etcd cluster on loopback ports for tests and benchmarks: members of Debian's
/usr/bin/etcd (never whatever PATH holds), their data in a directory of the caller's.

Members can be stopped, restarted and the leader killed; `close()` (also run at exit, and
the kernel kills a member whose parent dies: PR_SET_PDEATHSIG) stops every member it
started, by PID.

    with EtcdCluster(tmp_path) as cluster:
        store = open_url(cluster.url("/test"), key_path)
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ETCD = Path("/usr/bin/etcd")
ETCDCTL = Path("/usr/bin/etcdctl")
MAX_REQUEST_BYTES = 16 << 20
"""etcd takes 1.5 MiB per request by default; an inventory.yaml of 10,000 nodes is 1.6 MiB
with one interface and no tags each (bench_storm's), several MiB for real ones: members run
with --max-request-bytes 16 MiB (docs/store.md)."""
HEALTHY_WITHIN = 60.0  # seconds for a member to join and the cluster to elect a leader
PR_SET_PDEATHSIG = 1


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


class EtcdCluster:
    def __init__(self, base: Path, size: int = 3, max_request_bytes: int = MAX_REQUEST_BYTES):
        if not ETCD.is_file():
            raise FileNotFoundError(f"{ETCD}: install Debian's etcd-server (.ci/install-deps.sh)")
        self.base = Path(base)
        self.max_request_bytes = max_request_bytes
        ports = free_ports(2 * size)
        self.members = [Member(f"m{i}", ports[2 * i], ports[2 * i + 1], self.base / f"m{i}")
                        for i in range(size)]
        atexit.register(self.close)

    def __enter__(self) -> "EtcdCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def url(self, root: str = "/provisiond", order: list[int] | None = None) -> str:
        """The store URL naming every member (in `order`, by index) and a key root."""
        order = order if order is not None else list(range(len(self.members)))
        return "etcd://" + ",".join(self.members[i].endpoint for i in order) + root

    def start(self) -> None:
        for index in range(len(self.members)):
            self.start_member(index, wait=False)
        self.wait_healthy()

    def start_member(self, index: int, wait: bool = True) -> None:
        member = self.members[index]
        if member.process and member.process.poll() is None:
            return
        state = "existing" if member.data_dir.exists() else "new"
        member.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = open(self.base / f"{member.name}.log", "ab")
        member.process = subprocess.Popen(
            [str(ETCD), *self._flags(member, state)], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        log.close()
        if wait:
            self.wait_healthy([index])

    def stop_member(self, index: int, sig: int = signal.SIGTERM) -> None:
        """Stop one member (SIGKILL: as a crash) and wait until it is gone."""
        process = self.members[index].process
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)

    def leader(self) -> int:
        """The index of the member that is the leader now."""
        deadline = time.monotonic() + HEALTHY_WITHIN
        while time.monotonic() < deadline:
            for index, member in enumerate(self.members):
                status = self._status(member)
                if status and status.get("leader") == status["header"].get("member_id"):
                    return index
            time.sleep(0.1)
        raise TimeoutError(f"no etcd leader within {HEALTHY_WITHIN:.0f} s ({self.base})")

    def kill_leader(self) -> int:
        index = self.leader()
        self.stop_member(index, signal.SIGKILL)
        return index

    def wait_healthy(self, indexes: list[int] | None = None) -> None:
        """Until each member (all by default) answers /health with a leader elected."""
        deadline = time.monotonic() + HEALTHY_WITHIN
        for index in indexes if indexes is not None else range(len(self.members)):
            member = self.members[index]
            while not self._healthy(member):
                if member.process.poll() is not None:
                    raise RuntimeError(f"etcd {member.name} exited "
                                       f"{member.process.returncode}: see {self.base}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd {member.name} not healthy within "
                                       f"{HEALTHY_WITHIN:.0f} s: see {self.base}")
                time.sleep(0.1)

    def etcdctl(self, *args: str) -> bytes:
        env = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
        return subprocess.run([str(ETCDCTL), "--endpoints", ",".join(self.endpoints), *args],
                              env=env, check=True, capture_output=True, timeout=60).stdout

    def close(self) -> None:
        for index in range(len(self.members)):
            self.stop_member(index, signal.SIGKILL)

    def _flags(self, member: Member, state: str) -> list[str]:
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        client = f"http://127.0.0.1:{member.client_port}"
        return ["--name", member.name, "--data-dir", str(member.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", member.peer_url,
                "--initial-advertise-peer-urls", member.peer_url,
                "--initial-cluster", cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", f"provisiond-test-{os.getpid()}",
                "--max-request-bytes", str(self.max_request_bytes),
                # a loaded 2-core CI machine: heartbeats every 200 ms, elections after 2 s
                "--heartbeat-interval", "200", "--election-timeout", "2000",
                "--logger", "zap", "--log-level", "warn"]

    def _healthy(self, member: Member) -> bool:
        try:
            with urllib.request.urlopen(f"http://{member.endpoint}/health", timeout=2) as reply:
                return json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _status(self, member: Member) -> dict | None:
        request = urllib.request.Request(f"http://{member.endpoint}/v3/maintenance/status",
                                         data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return json.loads(reply.read())
        except (OSError, ValueError):
            return None


def cluster_fixture(scope: str = "module"):
    """A pytest fixture: one 3-member cluster for `scope` (a module whose tests stop or
    kill members keeps those to itself), stopped after it."""

    @pytest.fixture(scope=scope)
    def cluster(tmp_path_factory):
        with EtcdCluster(tmp_path_factory.mktemp("etcd")) as running:
            yield running

    return cluster


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (all held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
