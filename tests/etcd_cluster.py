"""A real etcd cluster on loopback ports for tests and benchmarks: members of Debian's
/usr/bin/etcd (never whatever PATH holds), their data in a directory of the caller's.

Members can be stopped, restarted and the leader killed; `close()` (also run at exit, and
the kernel kills a member whose parent dies: PR_SET_PDEATHSIG) stops every member it
started, by PID. With `tls` (make_tls: a CA, the members' certificate, a client's) members
serve clients over TLS and require a client certificate (--client-cert-auth).

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
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import pytest

from tests import certs

ETCD = Path("/usr/bin/etcd")
ETCDCTL = Path("/usr/bin/etcdctl")
MAX_REQUEST_BYTES = 16 << 20
"""etcd takes 1.5 MiB per request by default; an inventory.yaml of 10,000 nodes is 1.6 MiB
with one interface and no tags each (bench_storm's), several MiB for real ones: members run
with --max-request-bytes 16 MiB (docs/store.md)."""
HEALTHY_WITHIN = 60.0  # seconds for a member to join and the cluster to elect a leader
PR_SET_PDEATHSIG = 1


@dataclass
class ClusterTls:
    """PEM files in one folder: a CA, the members' certificate (for 127.0.0.1) and two
    clients' (without and with a Common Name), all signed by it."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert: Path
    client_key: Path
    named_client_cert: Path  # a client's with a Common Name
    named_client_key: Path

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(self.client_cert, self.client_key)
        return context


def make_tls(folder: Path, name: str = "etcd test") -> ClusterTls:
    """A new CA (its name: `name`) and certificates signed by it, written under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = certs.new_key()
    ca_name = certs.name(f"{name} CA")
    ca = (certs.builder(ca_name, ca_name, ca_key)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    files = ClusterTls(folder / "ca.pem", folder / "member.pem", folder / "member.key",
                       folder / "client.pem", folder / "client.key",
                       folder / "named-client.pem", folder / "named-client.key")
    files.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _issue(ca, ca_key, certs.name("etcd member"), files.cert_file, files.key_file)
    # no Common Name: with authentication on, etcd's gateway refuses a client certificate
    # that has one (it would name a user the gateway cannot pass on)
    _issue(ca, ca_key, certs.name("provisiond", NameOID.ORGANIZATION_NAME), files.client_cert,
           files.client_key)
    _issue(ca, ca_key, certs.name("provisiond"), files.named_client_cert,
           files.named_client_key)
    return files


def _issue(ca: x509.Certificate, ca_key, subject: x509.Name, cert_path: Path,
           key_path: Path) -> None:
    key = certs.new_key()
    # both usages: a member's gateway connects to its own gRPC server with the member's
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (certs.builder(subject, ca.subject, key)
            .add_extension(certs.addresses(), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256()))
    certs.write(cert, key, cert_path, key_path)


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
    def __init__(self, base: Path, size: int = 3, max_request_bytes: int = MAX_REQUEST_BYTES,
                 tls: ClusterTls | None = None, flags: tuple[str, ...] = ()):
        """`flags`: more etcd flags for every member (--auth-token-ttl...)."""
        if not ETCD.is_file():
            raise FileNotFoundError(f"{ETCD}: install Debian's etcd-server (.ci/install-deps.sh)")
        self.base = Path(base)
        self.max_request_bytes = max_request_bytes
        self.tls = tls
        self.flags = list(flags)
        self.ctl_user: str | None = None  # etcdctl's --user NAME:PASSWORD, once auth is on
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

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, root: str = "/provisiond", order: list[int] | None = None) -> str:
        """The store URL naming every member (in `order`, by index) and a key root."""
        order = order if order is not None else list(range(len(self.members)))
        scheme = "etcds" if self.tls else "etcd"
        return f"{scheme}://" + ",".join(self.members[i].endpoint for i in order) + root

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
        endpoints = ",".join(f"{self.scheme}://{endpoint}" for endpoint in self.endpoints)
        flags = ["--endpoints", endpoints]
        if self.tls:
            flags += ["--cacert", str(self.tls.ca_file), "--cert", str(self.tls.client_cert),
                      "--key", str(self.tls.client_key)]
        if self.ctl_user:
            flags += ["--user", self.ctl_user]
        return subprocess.run([str(ETCDCTL), *flags, *args],
                              env=env, check=True, capture_output=True, timeout=60).stdout

    def close(self) -> None:
        for index in range(len(self.members)):
            self.stop_member(index, signal.SIGKILL)

    def _flags(self, member: Member, state: str) -> list[str]:
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        client = f"{self.scheme}://127.0.0.1:{member.client_port}"
        tls = []
        if self.tls:
            tls = ["--cert-file", str(self.tls.cert_file), "--key-file", str(self.tls.key_file),
                   "--trusted-ca-file", str(self.tls.ca_file), "--client-cert-auth"]
        return [*tls, *self.flags, "--name", member.name, "--data-dir", str(member.data_dir),
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
            with self._open(f"{self.scheme}://{member.endpoint}/health") as reply:
                return json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _status(self, member: Member) -> dict | None:
        request = urllib.request.Request(
            f"{self.scheme}://{member.endpoint}/v3/maintenance/status", data=b"{}",
            method="POST")
        try:
            with self._open(request) as reply:
                return json.loads(reply.read())
        except (OSError, ValueError):
            return None

    def _open(self, request):
        context = self.tls.context() if self.tls else None
        return urllib.request.urlopen(request, timeout=2, context=context)


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
