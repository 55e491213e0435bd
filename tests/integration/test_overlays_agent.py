"""The node agent (overlays/agent) run for real on loopback.

Against provisiond itself (`provisiond serve --http`, a node whose address is 127.0.0.1, its
overlays built by `provisiond overlay build`), under busybox sh with only busybox applets as
on the tiny image: phases reported, the runtime overlay installed, 304 on provisiond's own
ETag, a rebuilt overlay fetched again, the refresh loop's jitter run (bounded).

Against a stand-in HTTP server of this file (not provisiond: its ETag is its own) for what
provisiond cannot be made to do on demand, with curl, GNU wget and busybox wget: a missing
overlay, a file that cannot be installed."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provisiond.config import REPO_ROOT, load_config
from provisiond.overlays import ensure_overlay
from provisiond.overlays.hostkeys import host_key_dir
from provisiond.status import read_status
from tests.conftest import run_provisiond
from tests.integration.boot.servers import free_port, start_serve, stop_serve, wait_http, \
    write_config
from tests.tools import tool

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # a node's PATH: Debian's dirs, no venv
AGENT = REPO_ROOT / "overlays/agent/usr/local/sbin/provisiond-agent"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "overlays"


class NodeServer(ThreadingHTTPServer):
    """A stand-in for provisiond: serves one runtime overlay with an ETag of its own and
    records the phases posted to it."""

    def __init__(self, body: bytes):
        super().__init__(("127.0.0.1", 0), Handler)
        self.body = body
        self.etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
        self.phases: list[tuple[str, str]] = []
        self.conditional: list[str | None] = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path != "/overlays/n001/runtime":
            self.send_error(404)
            return
        sent = self.headers.get("If-None-Match")
        self.server.conditional.append(sent)
        if sent == self.server.etag:
            self.send_response(304)
            self.send_header("ETag", self.server.etag)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("ETag", self.server.etag)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        self.server.phases.append((form["phase"][0], form.get("detail", [""])[0]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def fixture_config(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    for name in ("inventory.yaml", "provisiond.yaml"):
        shutil.copy(FIXTURES / name, state / name)
    return load_config(state)


@pytest.fixture
def server(fixture_config):
    httpd = NodeServer(ensure_overlay(fixture_config, "n001", "runtime").read_bytes())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _http_clients(tmp_path: Path) -> dict[str, dict]:
    bb_dir = tmp_path / "bb"
    bb_dir.mkdir()
    for applet in ("wget", "cpio"):
        (bb_dir / applet).symlink_to(tool("busybox"))
    return {"curl": {"PROVISIOND_AGENT_HTTP": "curl"},
            "gnu-wget": {"PROVISIOND_AGENT_HTTP": "wget"},
            "busybox-wget": {"PROVISIOND_AGENT_HTTP": "wget",
                             "PATH": f"{bb_dir}:{SYSTEM_PATH}"},
            "curl-without-cpio": {"PROVISIOND_AGENT_HTTP": "curl", "PROVISIOND_AGENT_CPIO": "sh"},
            "busybox-sh-without-cpio": {"PROVISIOND_AGENT_HTTP": "wget",
                                        "PROVISIOND_AGENT_CPIO": "sh",
                                        "PATH": f"{bb_dir}:{SYSTEM_PATH}",
                                        "SHELL_CMD": f"{tool('busybox')} sh"}}


def run_agent(tmp_path: Path, url: str, extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROVISIOND_URL=url, PROVISIOND_NODE="n001",
               PROVISIOND_AGENT_ROOT=str(tmp_path / "root"),
               PROVISIOND_AGENT_STATE=str(tmp_path / "state-agent"), PATH=SYSTEM_PATH)
    env.update(extra)
    shell = env.pop("SHELL_CMD", tool("sh")).split()
    return subprocess.run([*shell, str(AGENT), *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("client", ["curl", "gnu-wget", "busybox-wget", "curl-without-cpio",
                                    "busybox-sh-without-cpio"])
def test_agent_boot_installs_runtime_overlay_and_reports(tmp_path, fixture_config, server,
                                                         client):
    extra = _http_clients(tmp_path)[client]
    if "busybox" not in client and not tool(extra["PROVISIOND_AGENT_HTTP"]):
        pytest.skip(f"{client} not installed")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_agent(tmp_path, url, extra, "boot")
    assert result.returncode == 0, result.stderr
    assert [p for p, _ in server.phases] == ["booted", "runtime", "ready"]
    root = tmp_path / "root"
    key = root / "etc/ssh/ssh_host_ed25519_key"
    keys = host_key_dir(fixture_config, "n001")
    assert key.read_text() == (keys / "ssh_host_ed25519_key").read_text()
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert oct((root / "root/.ssh").stat().st_mode & 0o777) == "0o700"
    assert "admin@provisiond" in (root / "root/.ssh/authorized_keys").read_text()
    assert (tmp_path / "state-agent/etag").read_text().strip() == server.etag
    again = run_agent(tmp_path, url, extra, "refresh")
    assert again.returncode == 0, again.stderr
    assert "runtime overlay unchanged" in again.stderr
    assert server.conditional == [None, server.etag]


def test_agent_reports_failure_when_the_overlay_is_missing(tmp_path, server):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_agent(tmp_path, url, {"PROVISIOND_NODE": "n404",
                                       "PROVISIOND_AGENT_TRIES": "1"}, "boot")
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr
    assert server.phases[-1][0] == "failed"


def test_a_file_that_cannot_be_installed_fails_the_refresh_and_keeps_no_etag(tmp_path, server):
    """The ETag is only kept once every file is in place: otherwise the next refresh gets
    304 and the missing file is never installed."""
    (tmp_path / "root/etc").mkdir(parents=True)
    (tmp_path / "root/etc/ssh").write_text("a file where a directory must go\n")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_agent(tmp_path, url, {"PROVISIOND_AGENT_TRIES": "1"}, "boot")
    assert result.returncode == 1
    assert "cannot install /etc/ssh/ssh_host_ed25519_key" in result.stderr
    assert server.phases[-1][0] == "failed"
    assert not (tmp_path / "state-agent/etag").exists()
    (tmp_path / "root/etc/ssh").unlink()
    assert run_agent(tmp_path, url, {}, "refresh").returncode == 0
    assert (tmp_path / "root/etc/ssh/ssh_host_ed25519_key").is_file()
    assert server.conditional == [None, None]


NEW_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAgentTestAgentTestAgentTestAgentTestAgent ops@agent"


@pytest.fixture(scope="module")
def provisiond_http(tmp_path_factory):
    """(state dir, base URL) of `provisiond serve --http` on 127.0.0.1 with node n001 at
    127.0.0.1 (the runtime overlay is served only to the node's own address) and its
    overlays built."""
    if not tool("busybox"):
        pytest.skip("busybox-static is not installed")
    state = tmp_path_factory.mktemp("agent-serve") / "state"
    port = free_port()
    provisiond(state, "init", "--address", "127.0.0.5")
    write_config(state, http={"bind": "127.0.0.1", "port": port, "workers": 1})
    provisiond(state, "node", "add", "n001", "--ipaddr", "127.0.0.1", "--mac", "02:00:00:00:00:01")
    provisiond(state, "overlay", "build")
    proc = start_serve(state, "--http")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/boot/ipxe", proc)
        yield state, base
    finally:
        stop_serve(proc)


def provisiond(state: Path, *args: str) -> None:
    done = run_provisiond(state, *args)
    assert done.returncode == 0, done.stderr


def busybox_agent(tmp_path: Path) -> dict:
    """The agent's environment on a busybox image: a PATH of busybox applets only, busybox
    wget, busybox sh (which runs its applets even where the agent appends Debian's dirs)."""
    applets = tmp_path / "busybox-applets"
    applets.mkdir(exist_ok=True)
    busybox = tool("busybox")
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in listed.stdout.split():
        if not (applets / applet).exists():
            (applets / applet).symlink_to(busybox)
    return {"PROVISIOND_AGENT_HTTP": "wget", "PATH": str(applets),
            "SHELL_CMD": f"{busybox} sh"}


def provisiond_etag(base: str) -> str:
    """The ETag provisiond sends for n001's runtime overlay (asked from 127.0.0.1 = n001),
    checked against the sha256 of what it sent (the test builds nothing itself: a second
    writer of the overlay would change it under the server)."""
    with urllib.request.urlopen(f"{base}/overlays/n001/runtime", timeout=10) as reply:
        etag, body = reply.headers["ETag"], reply.read()
    assert etag == f'"{hashlib.sha256(body).hexdigest()}"'
    return etag


def test_agent_under_busybox_against_provisiond_200_then_304_then_a_changed_overlay(
        tmp_path, provisiond_http):
    state, base = provisiond_http
    agent = busybox_agent(tmp_path)
    kept = tmp_path / "state-agent/etag"
    booted = run_agent(tmp_path, base, agent, "boot")
    assert booted.returncode == 0, booted.stderr
    assert "runtime overlay applied" in booted.stderr
    assert read_status(load_config(state), "n001")["phase"] == "ready"
    keys = host_key_dir(load_config(state), "n001")
    installed = tmp_path / "root/etc/ssh/ssh_host_ed25519_key"
    assert installed.read_text() == (keys / "ssh_host_ed25519_key").read_text()
    etag = provisiond_etag(base)
    assert kept.read_text().strip() == etag

    again = run_agent(tmp_path, base, agent, "refresh")
    assert again.returncode == 0, again.stderr
    assert "runtime overlay unchanged" in again.stderr  # the agent's words for HTTP 304
    assert "applied" not in again.stderr

    provisiond(state, "node", "set", "n001", "--ssh-key", NEW_KEY)
    provisiond(state, "overlay", "build")
    deadline = time.monotonic() + 15  # serve sees a rebuild within its snapshot interval
    while (changed := provisiond_etag(base)) == etag and time.monotonic() < deadline:
        time.sleep(0.2)
    assert changed != etag, "provisiond still serves the overlay from before the rebuild"
    fetched = run_agent(tmp_path, base, agent, "refresh")
    assert fetched.returncode == 0, fetched.stderr
    assert "runtime overlay applied" in fetched.stderr
    assert NEW_KEY in (tmp_path / "root/root/.ssh/authorized_keys").read_text()
    assert kept.read_text().strip() == changed


DELAYS = 10  # refresh waits the loop test lets the agent take (each 0-2 s)


def test_agent_loop_waits_interval_plus_bounded_jitter_between_refreshes(tmp_path,
                                                                        provisiond_http):
    """`loop` under busybox: every wait is INTERVAL + 0..JITTER s (0 + 0..2 here, so the test
    stays short) and not always the same; each wait is followed by a refresh (200, then
    304 from provisiond)."""
    _, base = provisiond_http
    env = dict(PROVISIOND_URL=base, PROVISIOND_NODE="n001", PATH="",
               PROVISIOND_AGENT_ROOT=str(tmp_path / "root"),
               PROVISIOND_AGENT_STATE=str(tmp_path / "state-agent"),
               PROVISIOND_AGENT_INTERVAL="0", PROVISIOND_AGENT_JITTER="2")
    env.update(busybox_agent(tmp_path))
    shell = env.pop("SHELL_CMD").split()
    log = tmp_path / "loop.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*shell, str(AGENT), "loop"], env=env, stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(waits(log)) < DELAYS and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent's own session: it and its sleep
        proc.wait(10)
    text = log.read_text()
    delays = waits(log)[:DELAYS]
    assert len(delays) == DELAYS, text
    assert set(delays) <= {0, 1, 2} and len(set(delays)) > 1, delays
    assert text.count("runtime overlay applied") == 1, text
    assert text.count("runtime overlay unchanged") >= DELAYS - 2, text


def waits(log: Path) -> list[int]:
    return [int(n) for n in re.findall(r"next refresh in (\d+) s", log.read_text())]
