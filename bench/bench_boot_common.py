"""Shared by the boot benchmarks: a state dir with N reserved nodes, child processes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
NGINX = "/usr/sbin/nginx"
NGINX_CONF = """worker_processes 2; error_log {dir}/error.log; pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{ sendfile on; tcp_nopush on; access_log off; keepalive_timeout 65;
  server {{ listen 127.0.0.1:{port}; {locations} }} }}
"""

from tests.tools import command  # noqa: E402  (programs from the venv or Debian, not PATH)


def mac_of(i: int) -> str:
    return "52:54:00:%02x:%02x:%02x" % ((i >> 16) & 255, (i >> 8) & 255, i & 255)


def ip_of(i: int, net: str = "10.99") -> str:
    return f"{net}.{i // 250}.{i % 250 + 2}"


def make_state(count: int, net: str = "10.99", profiles: dict | None = None,
               **sections) -> Path:
    """A fresh state dir with provisiond.yaml `sections`, `profiles` and nodes n1..nCOUNT
    (addresses ip_of(i, net)) using every profile given."""
    state = Path(tempfile.mkdtemp(prefix="pvbench-")) / "state"
    state.parent.chmod(0o755)  # the peers (nginx, dnsmasq) drop to unprivileged users
    state.mkdir(parents=True)
    (state / "provisiond.yaml").write_text(yaml.safe_dump(sections))
    nodes = {f"n{i}": {"profiles": list(profiles or []), "image": "tiny", "netdevs": {"eth0": {
        "mac": mac_of(i), "ipaddr": ip_of(i, net), "netmask": "255.255.0.0"}}}
        for i in range(1, count + 1)}
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    (state / "inventory.yaml").write_text(yaml.dump(
        {"revision": 1, "profiles": profiles or {}, "nodes": nodes}, Dumper=dumper,
        sort_keys=False))
    return state


def add_blob(state: Path, data: bytes, repeat: int = 1) -> str:
    """Store `data` * `repeat` as a blob (written in pieces); returns its hex digest."""
    digest = hashlib.sha256()
    for _ in range(repeat):
        digest.update(data)
    blobs = state / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    with open(blobs / digest.hexdigest(), "wb") as handle:
        for _ in range(repeat):
            handle.write(data)
    return digest.hexdigest()


def add_image(state: Path, kernel: str, layers: list[str], name: str = "tiny") -> None:
    """An image manifest naming blobs already stored (the fields iPXE scripts read)."""
    manifest = {"name": name, "kernel": {"digest": f"sha256:{kernel}"},
                "layers": [{"digest": f"sha256:{layer}"} for layer in layers],
                "kernel_args": ["console=ttyS0"]}
    (state / "images" / name).mkdir(parents=True, exist_ok=True)
    (state / "images" / name / "manifest.json").write_text(json.dumps(manifest))


def start_nginx(folder: Path, port: int, locations: str) -> subprocess.Popen:
    """nginx-light, 2 workers (as many as provisiond's), sendfile, serving `locations`."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=folder, port=port, locations=locations))
    return start([NGINX, "-c", str(conf), "-p", str(folder), "-g", "daemon off;"])


def free_port(kind=socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(cmd: list[str], netns: str | None = None, env: dict | None = None,
          log: str = os.devnull) -> subprocess.Popen:
    cmd = command(cmd)
    if netns:
        cmd = command(["ip", "netns", "exec", netns, *cmd])
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def serve(state: Path, *args: str, netns: str | None = None) -> subprocess.Popen:
    """`provisiond serve` as configured (INFO log: one line per boot step), once it serves."""
    log = state / "serve.log"
    proc = start([sys.executable, "-m", "provisiond", "--state-dir", str(state), "serve",
                  *args], netns=netns, log=str(log))
    wait_for(lambda: proc.poll() is not None or b" serving " in log.read_bytes(), 120)
    if proc.poll() is not None:
        raise RuntimeError(f"provisiond serve exited: {log.read_text()[-500:]}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def up(url: str) -> bool:
    """The URL answers at all (any status but a connection error)."""
    try:
        urllib.request.urlopen(url, timeout=2).read(10)
        return True
    except OSError:
        return False


def wait_for(check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError("a benchmark server did not come up")
