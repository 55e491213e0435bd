"""Boot storm: N nodes, C at a time, each doing over HTTP what iPXE does when it boots: the
chain script, its own script, then the kernel, every layer and its overlays that the script
names, one after the other on one kept-alive connection. Once from `provisiond serve` and once
from nginx-light serving the same files (the scripts provisiond renders, the overlays it
built), in one run, on loopback.

    python bench/bench_storm.py [--nodes 1000] [--concurrency 200] [--rounds 3]
    python bench/bench_storm.py --store both [--nodes 1000] ...
    python bench/bench_storm.py --servers 2 [--nodes 1000] ...

`--store` picks the store of the one provisiond (files, the default, or etcd: a 3-member
cluster on loopback), compared with nginx; `both` runs one provisiond on each store instead,
the same nodes and files, and compares them with each other (no nginx), alternating who
goes first. On etcd, each storm also counts the requests the cluster served (its /metrics:
ranges, transactions, puts, watches), per node booted. Each storm starts once the last one's
phases are written (the server and etcd idle again; `--no-settle`: at once): on etcd the
phase writer lags the storm, and its writes would weigh on the next storm's server.

With `--servers 2` the peer is not nginx but provisiond itself: two `provisiond serve` on one
3-member etcd cluster (loopback), 2 x N nodes in the shared inventory, the image built on the
first server only (the second fetches its blobs from the first, checked, on their first
request). Each round storms N nodes on one server alone, and N nodes on each of the two at
once (the same concurrency each): the wall-time ratio two/one (1.0: two servers boot twice
the nodes in the same time; on one machine they share its cores) and the errors.

provisiond runs as a user runs it: its provisiond.yaml, the shipped `default` profile (its
system overlays built beforehand, as `provisiond overlay build` does), HTTP only. Each node
connects from its own reserved address (127.1.x.y), so the server finds the node, records its
phases and logs its boot steps as in a real storm. The machine is shared: each server runs
`--rounds` storms (default 3), alternating who goes first. Prints every time, the median
ratio (target >= 0.9), the errors (target 0), each server's CPU seconds (steadier than wall
time on a shared machine) and the RSS of the serve's processes before the first storm and
after the last (target: within 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shutil
import socket
import statistics
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from bench_boot_common import (add_blob, add_image, free_port, ip_of, mac_of, make_state,
                               serve, start_nginx, stop, up, wait_for)

NET = "127.1"  # the nodes' reserved addresses: loopback, so each node has its own source
KERNEL_MIB, LAYER_MIB, LAYER2_KIB = 6, 3, 64  # about the tiny image: kernel, busybox, scripts
NODE_TIMEOUT = 120.0
BUFFER_SIZE = 256 << 10  # per connection: a buffer shared by all would mix their bodies


def setup(nodes: int, port: int) -> Path:
    """The state dir: nodes with the `default` profile, a tiny image, system overlays built."""
    from provisiond.config import SHIPPED_DIR, load_config
    from provisiond.overlays import build_overlays

    profile = yaml.safe_load((SHIPPED_DIR / "profiles" / "default.yaml").read_text())
    state = make_state(nodes, net=NET, profiles={"default": profile},
                       server={"address": "127.0.0.1"}, http={"bind": "127.0.0.1", "port": port})
    add_image(state, kernel=add_blob(state, os.urandom(1 << 20), KERNEL_MIB),
              layers=[add_blob(state, os.urandom(1 << 20), LAYER_MIB),
                      add_blob(state, os.urandom(1 << 10), LAYER2_KIB)])
    started = time.monotonic()
    build_overlays(load_config(state), kinds=("shared", "system"))
    print(f"{nodes} nodes, system overlays built in {time.monotonic() - started:.1f} s",
          flush=True)
    return state


def mirror(state: Path) -> Path:
    """What nginx serves: every node's script as provisiond renders it, links to its
    overlays, the chain script."""
    from provisiond.boot.artifacts import ManifestCache, OverlayFiles
    from provisiond.boot.ipxe import chain_script, node_script
    from provisiond.boot.table import build_table
    from provisiond.config import SHIPPED_DIR, load_config

    config = load_config(state)
    table, manifests, overlays = build_table(config), ManifestCache(config), OverlayFiles(config)
    root = state / "mirror"
    (root / "scripts").mkdir(parents=True)
    (root / "chain.ipxe").write_text(chain_script(config))
    for mac, entry in table.by_mac.items():
        (root / "scripts" / mac).write_text(
            node_script(config, manifests, entry, table.nodes[entry.node]))
        (root / "overlays" / entry.node).mkdir(parents=True)
        for kind in ("shared", "system"):
            (root / "overlays" / entry.node / kind).symlink_to(overlays.path(entry.node, kind))
    return root


def nginx_locations(state: Path, root: Path) -> str:
    return (f"location = /boot/ipxe {{ alias {root}/chain.ipxe; }} "
            f"location /boot/ipxe/ {{ alias {root}/scripts/; }} "
            f"location /overlays/ {{ alias {root}/overlays/; }} "
            f"location /blobs/sha256/ {{ alias {state}/blobs/sha256/; }}")


class Connection:
    """One node's kept-alive HTTP/1.1 connection from its own address (as iPXE keeps one)."""

    def __init__(self, loop, source: str, server: tuple[str, int]):
        self.loop, self.source, self.server = loop, source, server
        self.sock: socket.socket | None = None
        self.pending = b""
        self.buffer = memoryview(bytearray(BUFFER_SIZE))

    async def connect(self) -> None:
        self.close()
        self.sock = socket.socket()
        self.sock.setblocking(False)
        self.sock.bind((self.source, 0))
        await self.loop.sock_connect(self.sock, self.server)
        self.pending = b""

    def close(self) -> None:
        if self.sock:
            self.sock.close()
            self.sock = None

    async def get(self, path: str, keep: bool = False) -> tuple[bytes, int]:
        """(body if `keep`, body length); reconnects once if the server closed the
        kept-alive connection; raises on anything but a whole 200 answer."""
        if self.sock is None:
            await self.connect()
        request = f"GET {path} HTTP/1.1\r\nHost: provisiond\r\nUser-Agent: iPXE\r\n\r\n"
        try:
            await self.loop.sock_sendall(self.sock, request.encode())
            head = await self._head()
        except (ConnectionError, EOFError):
            await self.connect()
            await self.loop.sock_sendall(self.sock, request.encode())
            head = await self._head()
        status, length, closes = _parse_head(head, path)
        body = await self._body(length, keep)
        if closes:
            self.close()
        return body, length

    async def _head(self) -> bytes:
        while b"\r\n\r\n" not in self.pending:
            chunk = await self.loop.sock_recv(self.sock, 65536)
            if not chunk:
                raise EOFError("connection closed")
            self.pending += chunk
        head, self.pending = self.pending.split(b"\r\n\r\n", 1)
        return head

    async def _body(self, length: int, keep: bool) -> bytes:
        body, self.pending = self.pending[:length], self.pending[length:]
        parts, left = [body], length - len(body)
        view = self.buffer
        while left > 0:
            got = await self.loop.sock_recv_into(self.sock, view[:min(left, BUFFER_SIZE)])
            if not got:
                raise EOFError(f"body cut {left} bytes short")
            if keep:
                parts.append(bytes(view[:got]))
            left -= got
        return b"".join(parts) if keep else b""


def _parse_head(head: bytes, path: str) -> tuple[int, int, bool]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    if status != 200:
        raise RuntimeError(f"{path}: HTTP {status}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return status, int(fields["content-length"]), fields.get("connection") == "close"


def script_paths(script: str) -> list[str]:
    """The kernel and initrd URLs of an iPXE script, as paths on the same server."""
    paths = []
    for line in script.splitlines():
        words = line.split()
        if words[:1] in (["kernel"], ["initrd"]):
            paths.append(urlsplit(next(w for w in words[1:] if "://" in w)).path)
    return paths


async def boot(loop, server: tuple[str, int], index: int) -> int:
    """One node's boot fetches; returns the bytes received."""
    conn = Connection(loop, ip_of(index, NET), server)
    try:
        await conn.get("/boot/ipxe")
        script, total = await conn.get(f"/boot/ipxe/{mac_of(index)}", keep=True)
        paths = script_paths(script.decode())
        if len(paths) < 3:
            raise RuntimeError(f"node {index}: no boot script: {script[:200]!r}")
        for path in paths:
            total += (await conn.get(path))[1]
        return total
    finally:
        conn.close()


async def storm(server: tuple[str, int], nodes: int, concurrency: int, first: int = 1
                ) -> dict:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(concurrency)
    errors: list[str] = []

    async def one(index: int) -> int:
        async with gate:
            try:
                return await asyncio.wait_for(boot(loop, server, index), NODE_TIMEOUT)
            except (OSError, RuntimeError, EOFError, ValueError, KeyError,
                    asyncio.TimeoutError) as exc:
                errors.append(f"n{index}: {type(exc).__name__} {exc}")
                return 0

    started = time.monotonic()
    sizes = await asyncio.gather(*(one(i) for i in range(first, first + nodes)))
    return {"seconds": time.monotonic() - started, "errors": errors, "bytes": sum(sizes)}


def session_cpu(leader: int) -> float:
    """CPU seconds used so far by the processes of a session (a server and its workers)."""
    total = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == leader:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def session_rss(leader: int) -> dict[str, float]:
    """MiB resident per process of the serve's session (serve, phase writer, gunicorn)."""
    result = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != leader:
                continue
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            rss = next(int(line.split()[1]) for line in (entry / "status").read_text()
                       .splitlines() if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
        result[f"{_role(cmd)} {entry.name}"] = rss / 1024
    return dict(sorted(result.items()))


def _role(cmd: list[bytes]) -> str:
    text = b" ".join(cmd).decode(errors="replace")
    if "gunicorn" in text:
        return "gunicorn"
    return "phase-writer" if "provisiond.boot.phases" in text else "serve"


def show_rss(label: str, rss: dict[str, float]) -> None:
    parts = ", ".join(f"{name} {mib:.0f}" for name, mib in rss.items())
    print(f"provisiond RSS {label}: {sum(rss.values()):.0f} MiB ({parts})", flush=True)


def run_storm(name: str, port: int, leader: int, args, cluster=None) -> tuple[str, dict]:
    """One storm of `args.nodes` on the server at `port`; with an etcd `cluster`, also its
    CPU and the requests it served meanwhile."""
    cpu = session_cpu(leader)
    before = etcd_usage(cluster) if cluster else None
    result = asyncio.run(storm(("127.0.0.1", port), args.nodes, args.concurrency))
    result["cpu"] = session_cpu(leader) - cpu
    print(f"{name:<14} {result['seconds']:6.2f} s  {len(result['errors'])} errors  "
          f"{result['bytes'] / 2**30:.1f} GiB  server CPU {result['cpu']:5.1f} s  "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    if before is not None:
        result["etcd"] = used = etcd_usage(cluster) - before
        requests = ", ".join(f"{method} {count} ({count / args.nodes:.1f}/node)"
                             for method, count in sorted(used.items()) if method != "cpu")
        print(f"{'':<14} etcd CPU {used['cpu']:5.1f} s; requests: {requests}", flush=True)
    for line in result["errors"][:5]:
        print(f"    {line}")
    if args.settle:
        waited, cpu = settle(leader, cluster)
        print(f"{'':<14} settled {waited:.1f} s after the storm (server and etcd CPU "
              f"meanwhile {cpu:.1f} s)", flush=True)
    return name, result


SETTLE_MAX = 300.0  # seconds


def settle(leader: int, cluster=None) -> tuple[float, float]:
    """Wait (at most SETTLE_MAX s) until the server's session uses under 5% of a core over
    a second and etcd takes no write in it (its members' own CPU never drops that low: 3
    members' heartbeats): the storm's phases written, so that they do not weigh on the next
    storm. (seconds waited, CPU seconds of the server and etcd meanwhile)"""
    def used() -> tuple[float, float, int]:
        etcd = etcd_usage(cluster) if cluster else collections.Counter()
        return session_cpu(leader), etcd["cpu"], etcd["Txn"] + etcd["Put"] + etcd["DeleteRange"]

    started = time.monotonic()
    first = last = used()
    while time.monotonic() - started < SETTLE_MAX:
        time.sleep(1.0)
        now = used()
        if now[0] - last[0] < 0.05 and now[2] == last[2]:
            break
        last = now
    return time.monotonic() - started, last[0] + last[1] - first[0] - first[1]


ETCD_METHODS = ("Range", "Txn", "Put", "DeleteRange", "Watch", "LeaseGrant")
STARTED_RE = re.compile(r'grpc_server_started_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\d+)')


def etcd_usage(cluster) -> collections.Counter:
    """The requests the cluster's members took so far (gRPC calls started: each gateway
    request is one; a watch is one stream), by method, and their CPU seconds ("cpu")."""
    used: collections.Counter = collections.Counter()
    for member in cluster.members:
        with urllib.request.urlopen(f"http://{member.endpoint}/metrics", timeout=10) as reply:
            for method, count in STARTED_RE.findall(reply.read().decode()):
                if method in ETCD_METHODS:
                    used[method] += int(count)
        fields = Path(f"/proc/{member.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        used["cpu"] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used


def alternate(round_: int, servers: dict, args, cluster=None) -> dict:
    """One storm from each server, who goes first alternating (the machine is shared)."""
    order = list(servers)
    if round_ % 2:
        order.reverse()
    return dict(run_storm(name, *servers[name], args, cluster) for name in order)


def on_etcd(state: Path, cluster, peer: int | None = None) -> Path:
    """`state` set to use the cluster's store (a new store key) and to fetch blobs from the
    server on port `peer`, if any."""
    from provisiond.state.crypt import create_key

    key = state / "store.key"
    if not key.exists():
        create_key(key)
    settings = yaml.safe_load((state / "provisiond.yaml").read_text()) or {}
    settings.update(store=cluster.url("/provisiond"))
    if peer is not None:
        settings.update(peers={"urls": [f"http://127.0.0.1:{peer}"]})
    (state / "provisiond.yaml").write_text(yaml.safe_dump(settings))
    return state


def publish(state: Path) -> None:
    """The files setup() wrote that the servers share, put on the store: the inventory and
    the image's manifest (what `provisiond state import` does, for these two)."""
    from provisiond.config import load_config
    from provisiond.state.open import open_store

    store = open_store(load_config(state))
    for key in ("inventory.yaml", "images/tiny/manifest.json"):
        store.put(key, (state / key).read_bytes())


def etcd_twin(state: Path, cluster, port: int) -> Path:
    """A copy of the files store's `state` (its blobs, inventory, manifest) serving on
    `port` from the cluster's store: the inventory and manifest published there, its system
    overlays built from it as setup() built the first's."""
    from provisiond.config import load_config
    from provisiond.overlays import build_overlays

    twin = state.parent / "etcd-state"
    shutil.copytree(state, twin, ignore=shutil.ignore_patterns(
        "overlay-builds", "mirror", "nginx", "serve.log", ".store"))
    settings = yaml.safe_load((twin / "provisiond.yaml").read_text())
    settings["http"] = {**settings["http"], "port": port}
    (twin / "provisiond.yaml").write_text(yaml.safe_dump(settings))
    on_etcd(twin, cluster)
    publish(twin)
    started = time.monotonic()
    build_overlays(load_config(twin), kinds=("shared", "system"))
    print(f"etcd copy: system overlays built in {time.monotonic() - started:.1f} s",
          flush=True)
    return twin


def second_server(first: Path, cluster, port: int, first_port: int) -> Path:
    """A state dir with only its settings and the store key: no blobs, no manifest, no
    inventory of its own; its system overlays built from the store, as the first's were."""
    from provisiond.config import load_config
    from provisiond.overlays import build_overlays

    state = first.parent / "second"
    state.mkdir()
    settings = yaml.safe_load((first / "provisiond.yaml").read_text())
    settings["http"] = {**settings["http"], "port": port}
    settings["peers"] = {"urls": [f"http://127.0.0.1:{first_port}"]}
    (state / "provisiond.yaml").write_text(yaml.safe_dump(settings))
    (state / "store.key").write_bytes((first / "store.key").read_bytes())
    (state / "store.key").chmod(0o600)
    build_overlays(load_config(state), kinds=("shared", "system"))
    return state


async def storms(targets: list[tuple[tuple[str, int], range]], concurrency: int) -> dict:
    """Storms on several servers at once, each its own nodes: the wall time of all."""
    started = time.monotonic()
    results = await asyncio.gather(*(storm(server, len(nodes), concurrency, first=nodes.start)
                                     for server, nodes in targets))
    return {"seconds": time.monotonic() - started,
            "errors": [e for r in results for e in r["errors"]],
            "bytes": sum(r["bytes"] for r in results)}


def two_servers(args) -> None:
    """--servers 2: one server storming N nodes against two storming N each, one etcd."""
    from tests.etcd_cluster import EtcdCluster

    ports = [free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)]
    first = setup(2 * args.nodes, ports[0])
    with EtcdCluster(first.parent / "etcd") as cluster:
        on_etcd(first, cluster, ports[1])
        publish(first)
        second = second_server(first, cluster, ports[1], ports[0])
        procs = [serve(state, "--http", "--no-dhcp", "--no-tftp", "--no-dns")
                 for state in (first, second)]
        try:
            wait_for(lambda: all(up(f"http://127.0.0.1:{p}/boot/ipxe") for p in ports))
            time.sleep(2)  # the workers settle
            print(f"{args.nodes} nodes a server, {args.concurrency} at a time each; etcd "
                  f"{len(cluster.members)} members; load average {os.getloadavg()[0]:.2f}",
                  flush=True)
            one = [("127.0.0.1", ports[0]), range(1, args.nodes + 1)]
            two = [one, [("127.0.0.1", ports[1]), range(args.nodes + 1, 2 * args.nodes + 1)]]
            runs = []
            for round_ in range(args.rounds):
                order = [("one server", [one]), ("two servers", two)]
                if round_ % 2:
                    order.reverse()
                done = {}
                for name, targets in order:
                    done[name] = asyncio.run(storms(targets, args.concurrency))
                    result = done[name]
                    print(f"{name:<12} {result['seconds']:6.2f} s  {len(result['errors'])} "
                          f"errors  {result['bytes'] / 2**30:.1f} GiB  (load average "
                          f"{os.getloadavg()[0]:.1f})", flush=True)
                    for line in result["errors"][:5]:
                        print(f"    {line}")
                    if args.settle:  # both servers' phases written before the next storm
                        waited = sum(settle(proc.pid, cluster)[0] for proc in procs)
                        print(f"{'':<12} settled {waited:.1f} s after the storm", flush=True)
                runs.append(done)
            ratios = [r["two servers"]["seconds"] / r["one server"]["seconds"] for r in runs]
            errors = {name: sum(len(r[name]["errors"]) for r in runs)
                      for name in ("one server", "two servers")}
            print(f"ratio (two servers, {2 * args.nodes} nodes / one server, {args.nodes} "
                  f"nodes; wall time) {statistics.median(ratios):.2f}, median of {len(runs)} "
                  f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}); errors one server "
                  f"{errors['one server']}, two servers {errors['two servers']}")
        finally:
            for proc in procs:
                stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000,
                        help="nodes in a storm (with --servers 2: on each server)")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3,
                        help="storms from each server, alternating who goes first")
    parser.add_argument("--servers", type=int, choices=(1, 2), default=1,
                        help="2: two provisiond on one etcd against one (no nginx)")
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="start each storm at once, not when the last one's phases "
                        "are written")
    parser.add_argument("--store", choices=("files", "etcd", "both"), default="files",
                        help="the store of the one provisiond (against nginx); both: one on "
                        "each, against each other")
    args = parser.parse_args()
    if args.servers == 2:
        two_servers(args)
        return
    one_server(args)


def one_server(args) -> None:
    """One provisiond on each store of `--store`, and nginx unless both stores run."""
    from tests.etcd_cluster import EtcdCluster

    stores = ["files", "etcd"] if args.store == "both" else [args.store]
    ports = {name: free_port(socket.SOCK_STREAM) for name in [*stores, "nginx"]}
    files_state = setup(args.nodes, ports.get("files", ports["nginx"]))
    with contextlib.ExitStack() as stack:
        cluster = None
        states = {}
        if "files" in stores:
            states["files"] = files_state
        if "etcd" in stores:
            cluster = stack.enter_context(EtcdCluster(files_state.parent / "etcd"))
            states["etcd"] = etcd_twin(files_state, cluster, ports["etcd"])
        procs = {}
        try:
            for store, state in states.items():
                procs[f"provisiond-{store}"] = (ports[store], serve(
                    state, "--http", "--no-dhcp", "--no-tftp", "--no-dns"))
            if args.store != "both":
                root = mirror(files_state)
                procs["nginx"] = (ports["nginx"], start_nginx(
                    files_state / "nginx", ports["nginx"], nginx_locations(files_state, root)))
            compare(procs, cluster, args)
        finally:
            for _, proc in procs.values():
                stop(proc)


def compare(procs: dict, cluster, args) -> None:
    """`args.rounds` storms from each server, alternating; times, errors, RSS and ratios."""
    wait_for(lambda: all(up(f"http://127.0.0.1:{port}/boot/ipxe") for port, _ in procs.values()))
    time.sleep(2)  # the workers settle
    ours = [name for name in procs if name.startswith("provisiond")]
    before = {name: session_rss(procs[name][1].pid) for name in ours}
    for name in ours:
        show_rss(f"{name} before", before[name])
    print(f"{args.nodes} nodes, {args.concurrency} at a time; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    servers = {name: (port, proc.pid) for name, (port, proc) in procs.items()}
    runs = [alternate(round_, servers, args, cluster) for round_ in range(args.rounds)]
    time.sleep(2)
    after = {name: session_rss(procs[name][1].pid) for name in ours}
    for name in ours:
        show_rss(f"{name} after", after[name])
    errors = sum(len(r[name]["errors"]) for r in runs for name in procs)
    peer, other = ("nginx", ours[0]) if "nginx" in procs else ours
    ratios = [r[peer]["seconds"] / r[other]["seconds"] for r in runs]
    cpu = [r[other]["cpu"] / r[peer]["cpu"] for r in runs if r[peer]["cpu"]]
    growth = ", ".join(f"{name} {sum(after[name].values()) / sum(before[name].values()):.2f}"
                       for name in ours)
    targets = " (target >= 0.9, 0 errors)" if peer == "nginx" else ""
    print(f"ratio ({peer} time / {other} time) {statistics.median(ratios):.2f}, median of "
          f"{len(runs)} (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); errors {errors}"
          f"{targets}; RSS after/before {growth} (target <= 1.5); server "
          f"CPU {other}/{peer} {statistics.median(cpu) if cpu else float('nan'):.1f}x")
    if cluster is not None:
        name = next(name for name in procs if name.endswith("etcd"))
        ranges = [r[name]["etcd"]["Range"] / args.nodes for r in runs]
        print(f"etcd range requests per node booted ({name}): "
              f"{', '.join(f'{x:.2f}' for x in ranges)}")


if __name__ == "__main__":
    main()
