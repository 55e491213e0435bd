"""The node agent (overlays/agent) run for real against an HTTP server on loopback: it
reports its phases, fetches the node's runtime overlay built by provisiond, installs it
with its modes, keeps the ETag and gets 304 on the next refresh. With curl, GNU wget and
busybox wget."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provisiond.config import REPO_ROOT, load_config
from provisiond.overlays import ensure_overlay
from provisiond.overlays.hostkeys import host_key_dir
from tests.tools import tool

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # a node's PATH: Debian's dirs, no venv
AGENT = REPO_ROOT / "overlays/agent/usr/local/sbin/provisiond-agent"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "overlays"


class NodeServer(ThreadingHTTPServer):
    """Serves one runtime overlay with an ETag and records the phases posted to it."""

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
