"""Start `provisiond serve` as a child process for integration tests, and wait for it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from provisiond.config import write_default_config
from tests.integration.boot.netns import in_netns

REPO = Path(__file__).resolve().parents[3]


def free_port(kind=socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loopback_services(state: Path) -> dict[str, int]:
    """A new state dir whose serve answers HTTP, TFTP and DNS on free 127.0.0.1 ports
    (server 127.0.0.1, domain cluster, one HTTP worker); returns {service: port}."""
    write_default_config(state)
    ports = {"http": free_port(), "tftp": free_port(socket.SOCK_DGRAM),
             "dns": free_port(socket.SOCK_DGRAM)}
    write_config(state, server={"address": "127.0.0.1", "domain": "cluster"},
                 http={"bind": "127.0.0.1", "port": ports["http"], "workers": 1},
                 tftp={"enabled": True, "bind": "127.0.0.1", "port": ports["tftp"]},
                 dns={"enabled": True, "bind": "127.0.0.1", "port": ports["dns"]})
    return ports


def write_config(state_dir: Path, **sections) -> dict:
    """Merge `sections` into provisiond.yaml (e.g. http={"port": 1234})."""
    path = state_dir / "provisiond.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    for key, value in sections.items():
        data[key] = {**(data.get(key) or {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(data))
    return data


def start_serve(state_dir: Path, *args: str, netns: str | None = None,
                log_path: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "provisiond", "serve", *args]
    if netns:
        cmd = in_netns(netns, cmd)
    log = open(log_path or state_dir / "serve.log", "wb")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"provisiond serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def stop_serve(proc: subprocess.Popen, timeout: float = 20) -> int:
    """SIGTERM, wait; anything left in its session (gunicorn) is killed as a last resort."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def session_alive(proc: subprocess.Popen) -> bool:
    """True if any process of the serve's session (e.g. gunicorn) still runs."""
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def api_call(port: int, token: str, method: str, path: str, body=None, headers=None):
    """(status, headers, parsed JSON or None) of one request on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sent = {"Authorization": f"Bearer {token}", **(headers or {})}
        data = None
        if body is not None:
            data, sent["Content-Type"] = json.dumps(body), "application/json"
        conn.request(method, path, body=data, headers=sent)
        response = conn.getresponse()
        raw = response.read()
        return response.status, dict(response.getheaders()), json.loads(raw) if raw else None
    finally:
        conn.close()
