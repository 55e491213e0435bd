"""The node agent (provisiond/shipped/overlays/agent) run for real on loopback.

Against provisiond itself (`provisiond serve --http`, a node whose address is 127.0.0.1, its
overlays built by `provisiond overlay build`), under busybox sh with only busybox applets as
on the tiny image: the token of a served iPXE script exchanged for the node credential,
phases reported, the runtime overlay installed, 304 on provisiond's own ETag, a rebuilt
overlay fetched again, the refresh loop's jitter run (bounded).

Against a stand-in HTTP server of this file (not provisiond: its ETag is its own) for what
provisiond cannot be made to do on demand, with curl and busybox nc: a missing overlay, a
file that cannot be installed, how the token and the credential travel."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provisiond.config import SHIPPED_DIR, load_config
from provisiond.overlays import ensure_overlay
from provisiond.overlays.hostkeys import host_key_dir
from provisiond.service.status import status_document
from provisiond.status import read_status
from tests.conftest import run_provisiond
from tests.integration.boot.servers import free_port, start_serve, stop_serve, wait_http, \
    write_config
from tests import systemd_sandbox
from tests.tools import tool
from tests.unit.boot.bootdata import add_image, token_in

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # a node's PATH: Debian's dirs, no venv
AGENT = SHIPPED_DIR / "overlays/agent/usr/local/sbin/provisiond-agent"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "overlays"


TOKEN = "1.token-of-the-test"
CREDENTIAL = "credential-of-the-test"


class NodeServer(ThreadingHTTPServer):
    """A stand-in for provisiond: trades TOKEN for CREDENTIAL, serves one runtime overlay
    with an ETag of its own and records the phases posted to it (both with CREDENTIAL
    only), the exchanges (token, source port) and the requests refused."""

    def __init__(self, body: bytes):
        super().__init__(("127.0.0.1", 0), Handler)
        self.body = body
        self.etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
        self.phases: list[tuple[str, str]] = []
        self.conditional: list[str | None] = []
        self.exchanges: list[tuple[str, int]] = []
        self.refused = 0
        self.unavailable = 0  # status reports answered 503 (a server restarting) before any


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {CREDENTIAL}":
            return True
        self.server.refused += 1
        self.send_error(401)
        return False

    def do_GET(self):
        if self.path != "/overlays/n001/runtime":
            self.send_error(404)
            return
        if not self.authorized():
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
        body = self.rfile.read(length)
        form = urllib.parse.parse_qs(body.decode())
        if self.path.startswith("/api/v1/credentials/"):
            self.exchange(form)
            return
        if self.path.startswith("/api/v1/facts/"):  # JSON, in the phases' order as "facts"
            if self.authorized():
                self.server.phases.append(("facts", str(sorted(json.loads(body)))))
                self.answer(b"{}")
            return
        if self.server.unavailable > 0:
            self.server.unavailable -= 1
            self.send_error(503)
            return
        if self.authorized():
            self.server.phases.append((form["phase"][0], form.get("detail", [""])[0]))
            self.answer(b"{}")

    def exchange(self, form: dict) -> None:
        """The credential in the answer, or (busybox nc) sent to the agent's listener once
        it said the key (as provisiond does); records (token, the port proving root)."""
        if "callback" not in form:
            self.server.exchanges.append((form["token"][0], self.client_address[1]))
            self.answer(f"{CREDENTIAL}\n".encode())
            return
        port = int(form["callback"][0])
        self.server.exchanges.append((form["token"][0], port))
        with connect_when_listening(self.client_address[0], port) as sock:
            said = sock.makefile("rb").readline().strip().decode()
            assert said == form["callback_key"][0]
            sock.sendall(f"{CREDENTIAL}\n".encode())
        self.answer(b"delivered\n")

    def answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def connect_when_listening(address: str, port: int) -> socket.socket:
    """A connection to the agent's nc listener, tried again while refused (it may still be
    starting, as provisiond's send_by_callback allows for), for at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection((address, port), timeout=10)
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


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
    for applet in ("nc", "cpio"):
        (bb_dir / applet).symlink_to(tool("busybox"))
    return {"curl": {"PROVISIOND_AGENT_HTTP": "curl"},
            "busybox-nc": {"PROVISIOND_AGENT_HTTP": "nc", "PATH": f"{bb_dir}:{SYSTEM_PATH}"},
            "curl-without-cpio": {"PROVISIOND_AGENT_HTTP": "curl", "PROVISIOND_AGENT_CPIO": "sh"},
            "busybox-sh-without-cpio": {"PROVISIOND_AGENT_HTTP": "nc",
                                        "PROVISIOND_AGENT_CPIO": "sh",
                                        "PATH": f"{bb_dir}:{SYSTEM_PATH}",
                                        "SHELL_CMD": f"{tool('busybox')} sh"}}


def run_agent(tmp_path: Path, url: str, extra: dict, *args: str) -> subprocess.CompletedProcess:
    """The agent as root on node n001, with TOKEN (or extra's) on its 'command line'."""
    env = dict(os.environ, PROVISIOND_URL=url, PROVISIOND_NODE="n001",
               PROVISIOND_TOKEN=TOKEN, PROVISIOND_AGENT_RUN=str(tmp_path / "run"),
               PROVISIOND_AGENT_ROOT=str(tmp_path / "root"),
               PROVISIOND_AGENT_STATE=str(tmp_path / "state-agent"), PATH=SYSTEM_PATH)
    env.update(extra)
    shell = env.pop("SHELL_CMD", tool("sh")).split()
    return subprocess.run([*shell, str(AGENT), *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("client", ["curl", "busybox-nc", "curl-without-cpio",
                                    "busybox-sh-without-cpio"])
def test_agent_boot_installs_runtime_overlay_and_reports(tmp_path, fixture_config, server,
                                                         client):
    """The token goes once, from a port below 1024; the credential lands 0600 in a 0700
    directory and opens every later request (the stand-in refuses any without it)."""
    extra = _http_clients(tmp_path)[client]
    if "busybox" not in client and not tool(extra["PROVISIOND_AGENT_HTTP"]):
        pytest.skip(f"{client} not installed")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_agent(tmp_path, url, extra, "boot")
    assert result.returncode == 0, result.stderr
    assert [t for t, _ in server.exchanges] == [TOKEN] and server.exchanges[0][1] < 1024
    assert server.refused == 0
    run = tmp_path / "run"
    assert (run / "credential").read_text() == f"{CREDENTIAL}\n"
    assert oct(run.stat().st_mode & 0o777) == "0o700"
    assert oct((run / "credential").stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in run.iterdir()) == ["authorization", "credential",
                                                     "runtime-applied"]
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
    rebooted = run_agent(tmp_path, url, extra, "boot")  # the unit run again, same boot
    assert rebooted.returncode == 0 and len(server.exchanges) == 1  # no second exchange


def test_agent_reports_failure_when_the_overlay_is_missing(tmp_path, server):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_agent(tmp_path, url, {"PROVISIOND_NODE": "n404",
                                       "PROVISIOND_AGENT_TRIES": "1"}, "boot")
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr
    assert server.phases[-1][0] == "failed"


def with_facts(tmp_path: Path) -> dict:
    """The agent's environment with the shipped facts collector on its PATH (it reads this
    machine's /sys and /proc), as on a node."""
    bin_dir = tmp_path / "facts-bin"
    bin_dir.mkdir()
    (bin_dir / "provisiond-facts").symlink_to(AGENT.parent / "provisiond-facts")
    return {"PATH": f"{bin_dir}:{SYSTEM_PATH}"}


def test_boot_sends_the_facts_after_ready_or_failed_so_no_boot_waits_for_them(tmp_path,
                                                                               server):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    facts = with_facts(tmp_path)
    result = run_agent(tmp_path, url, facts, "boot")
    assert result.returncode == 0, result.stderr
    assert [p for p, _ in server.phases] == ["booted", "runtime", "ready", "facts"]
    assert server.phases[-1][1] == str(sorted(["cpu", "memory_mib", "disks", "nics", "dmi",
                                               "bmc"]))
    server.phases.clear()
    failed = run_agent(tmp_path / "again", url, {**facts, "PROVISIOND_NODE": "n404",
                                                 "PROVISIOND_AGENT_TRIES": "1"}, "boot")
    assert failed.returncode == 1  # the facts' report does not hide the failure
    assert [p for p, _ in server.phases] == ["booted", "failed", "facts"]


def test_boot_start_ends_at_the_runtime_overlay_and_boot_finish_configures_then_ready(
        tmp_path, server):
    """systemd's two units: sshd waits for the first only, the configure run is the second's."""
    url = f"http://127.0.0.1:{server.server_address[1]}"
    configure = tmp_path / "provisiond-configure"
    configure.write_text("#!/bin/sh\necho 'PLAY RECAP ok=3 failed=0'\n")
    configure.chmod(0o755)
    extra = {"PROVISIOND_AGENT_CONFIGURE": str(configure)}
    started = run_agent(tmp_path, url, extra, "boot-start")
    assert started.returncode == 0, started.stderr
    assert [p for p, _ in server.phases] == ["booted", "runtime"]
    assert (tmp_path / "root/etc/ssh/ssh_host_ed25519_key").exists()  # what sshd needs
    finished = run_agent(tmp_path, url, extra, "boot-finish")
    assert finished.returncode == 0, finished.stderr
    assert server.phases[2:] == [("configured", "PLAY RECAP ok=3 failed=0"),
                                 ("ready", "node ready")]
    configure.write_text("#!/bin/sh\necho broken; exit 2\n")
    failed = run_agent(tmp_path, url, extra, "boot-finish")
    assert failed.returncode == 1 and server.phases[-1][0] == "failed"


def test_no_configure_run_and_no_ready_after_boot_start_failed(tmp_path, server):
    """A node whose runtime overlay did not come in (here: a corrupt archive; the munge key,
    the host keys missing) never says ready over its failed: not from boot-finish run by hand,
    not from the ansible-pull timer's configure run (which ran the playbook and reported
    configured and ready). Once boot-start goes well (the unit started again), they do."""
    url = f"http://127.0.0.1:{server.server_address[1]}"
    runs = tmp_path / "configure-runs"
    configure = tmp_path / "provisiond-configure"
    configure.write_text(f"#!/bin/sh\necho run >>{runs}\necho 'PLAY RECAP ok=1 failed=0'\n")
    configure.chmod(0o755)
    extra = {"PROVISIOND_AGENT_CONFIGURE": str(configure), "PROVISIOND_AGENT_TRIES": "1"}
    good = server.body
    server.body = b"not a gzip archive"
    started = run_agent(tmp_path, url, extra, "boot-start")
    assert started.returncode == 1 and "cannot unpack" in started.stderr
    assert [p for p, _ in server.phases] == ["booted", "failed"]
    for command in (["boot-finish"], ["configure", "--only-if-changed"], ["configure"]):
        later = run_agent(tmp_path, url, extra, *command)
        assert later.returncode == 1, (command, later.stderr)
        assert "the runtime overlay of this boot is not in" in later.stderr, later.stderr
    assert [p for p, _ in server.phases] == ["booted", "failed"] and not runs.exists()
    server.body = good
    assert run_agent(tmp_path, url, extra, "boot-start").returncode == 0
    finished = run_agent(tmp_path, url, extra, "boot-finish")
    assert finished.returncode == 0, finished.stderr
    assert [p for p, _ in server.phases][2:] == ["booted", "runtime", "configured", "ready"]
    assert runs.read_text() == "run\n"


@pytest.mark.parametrize("unit", ["boot-start", "boot-finish"])
def test_a_failed_boot_sends_its_facts_before_systemd_ends_the_unit(tmp_path, server, unit):
    """systemd ends every process left in a Type=oneshot unit whose ExecStart failed (its
    cgroup, at once: service.c's FINAL_SIGTERM): the agent's process group killed as soon
    as the unit's command exits 1 stands in for that. The facts of a failed boot (no
    runtime overlay; a failed configure run), the one an operator looks into, must be in
    by then."""
    url = f"http://127.0.0.1:{server.server_address[1]}"
    configure = tmp_path / "provisiond-configure"
    configure.write_text("#!/bin/sh\necho broken; exit 2\n")
    configure.chmod(0o755)
    extra = {"PROVISIOND_AGENT_TRIES": "1", "PROVISIOND_AGENT_CONFIGURE": str(configure),
             **with_facts(tmp_path)}
    if unit == "boot-finish":  # the first unit went well: the credential is in
        assert run_agent(tmp_path, url, {**extra, "PATH": SYSTEM_PATH},
                         "boot-start").returncode == 0
    else:
        extra["PROVISIOND_NODE"] = "n404"  # no runtime overlay
    env = {**os.environ, "PROVISIOND_URL": url, "PROVISIOND_NODE": "n001",
           "PROVISIOND_TOKEN": TOKEN, "PROVISIOND_AGENT_RUN": str(tmp_path / "run"),
           "PROVISIOND_AGENT_ROOT": str(tmp_path / "root"),
           "PROVISIOND_AGENT_STATE": str(tmp_path / "state-agent"), **extra}
    agent = subprocess.Popen([tool("sh"), str(AGENT), unit], env=env, start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        assert agent.wait(timeout=60) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGKILL)  # the unit's leftovers, as systemd ends them
    assert [p for p, _ in server.phases][-2:] == ["failed", "facts"]


@pytest.mark.parametrize("fails", [False, True])
def test_the_boots_last_word_outlives_a_server_restarting(tmp_path, server, fails):
    """ready and failed are never superseded by a later phase: one lost to a server that
    was restarting (503) left the node's status at runtime for good. They are tried again
    (PROVISIOND_AGENT_TRIES times); an answer of 4xx is not."""
    url = f"http://127.0.0.1:{server.server_address[1]}"
    configure = tmp_path / "provisiond-configure"
    configure.write_text("#!/bin/sh\necho broken; exit 2\n" if fails else "#!/bin/sh\n")
    configure.chmod(0o755)
    extra = {"PROVISIOND_AGENT_CONFIGURE": str(configure), "PROVISIOND_AGENT_TRIES": "3"}
    assert run_agent(tmp_path, url, extra, "boot-start").returncode == 0
    server.unavailable = 2
    finished = run_agent(tmp_path, url, extra, "boot-finish")
    assert finished.returncode == (1 if fails else 0), finished.stderr
    if fails:  # both 503s to failed, then in
        assert [p for p, _ in server.phases][2:] == ["failed"]
        assert finished.stderr.count("could not report phase failed to") == 2
    else:  # one 503 to configured (tried once: ready follows), one to ready, then in
        assert [p for p, _ in server.phases][2:] == ["ready"]
        assert finished.stderr.count("could not report phase ready to") == 1


def test_facts_that_hang_do_not_hold_a_failed_boot_start_and_sshd_after_it(tmp_path, server):
    """A failed boot sends its facts before its unit ends, and sshd waits for that unit
    (Before=ssh.service): a collector that hangs (ipmitool before a BMC that does not
    answer) is bounded by PROVISIOND_FACTS_TIMEOUT s."""
    url = f"http://127.0.0.1:{server.server_address[1]}"
    bin_dir = tmp_path / "facts-bin"
    bin_dir.mkdir()
    (bin_dir / "provisiond-facts").write_text("#!/bin/sh\nexec sleep 600\n")
    (bin_dir / "provisiond-facts").chmod(0o755)
    failed = run_agent(tmp_path, url, {"PATH": f"{bin_dir}:{SYSTEM_PATH}",
                                       "PROVISIOND_FACTS_TIMEOUT": "1",
                                       "PROVISIOND_NODE": "n404", "PROVISIOND_AGENT_TRIES": "1"},
                       "boot-start")
    assert failed.returncode == 1
    assert "provisiond-facts did not end within 1 s" in failed.stderr, failed.stderr
    assert [p for p, _ in server.phases] == ["booted", "failed"]


@pytest.mark.parametrize("client", ["curl", "busybox-nc"])
def test_without_a_token_or_a_credential_the_agent_says_why(tmp_path, server, client):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    extra = _http_clients(tmp_path)[client]
    result = run_agent(tmp_path, url, {**extra, "PROVISIOND_TOKEN": ""}, "boot")
    assert result.returncode == 1 and "no provisiond.token=" in result.stderr
    assert not server.exchanges and not server.phases
    refreshed = run_agent(tmp_path, url, {**extra, "PROVISIOND_AGENT_TRIES": "1"}, "refresh")
    assert refreshed.returncode == 1 and "HTTP 401: the node credential is missing" in \
        refreshed.stderr


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


MAC = "02:00:00:00:00:01"
NEW_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAgentTestAgentTestAgentTestAgentTestAgent ops@agent"


@pytest.fixture(scope="module")
def provisiond_http(tmp_path_factory):
    """(state dir, base URL) of `provisiond serve --http` on 127.0.0.1 with node n001 at
    127.0.0.1 (the runtime overlay is served only with its credential, from that address),
    its overlays built and a (stand-in) build of its image, so its iPXE script boots a
    kernel and carries a token."""
    if not tool("busybox"):
        pytest.skip("busybox-static is not installed")
    state = tmp_path_factory.mktemp("agent-serve") / "state"
    port = free_port()
    provisiond(state, "init", "--address", "127.0.0.5")
    write_config(state, http={"bind": "127.0.0.1", "port": port, "workers": 1})
    provisiond(state, "node", "add", "n001", "--ipaddr", "127.0.0.1", "--mac", MAC)
    add_image(load_config(state), "tiny")
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
    nc, busybox sh (which runs its applets even where the agent appends Debian's dirs)."""
    applets = tmp_path / "busybox-applets"
    applets.mkdir(exist_ok=True)
    busybox = tool("busybox")
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in listed.stdout.split():
        if not (applets / applet).exists():
            (applets / applet).symlink_to(busybox)
    return {"PROVISIOND_AGENT_HTTP": "nc", "PATH": str(applets),
            "SHELL_CMD": f"{busybox} sh"}


def fresh_token(base: str) -> dict:
    """The agent's environment part for a new boot: the token of a newly served script."""
    with urllib.request.urlopen(f"{base}/boot/ipxe/{MAC}", timeout=10) as reply:
        return {"PROVISIOND_TOKEN": token_in(reply.read().decode())}


def provisiond_etag(base: str, tmp_path: Path) -> str:
    """The ETag provisiond sends for n001's runtime overlay (asked from 127.0.0.1 = n001
    with the credential its agent got), checked against the sha256 of what it sent (the
    test builds nothing itself: a second writer of the overlay would change it under the
    server)."""
    credential = (tmp_path / "run/credential").read_text().strip()
    request = urllib.request.Request(f"{base}/overlays/n001/runtime",
                                     headers={"Authorization": f"Bearer {credential}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        etag, body = reply.headers["ETag"], reply.read()
    assert etag == f'"{hashlib.sha256(body).hexdigest()}"'
    return etag


def test_agent_under_busybox_against_provisiond_200_then_304_then_a_changed_overlay(
        tmp_path, provisiond_http):
    state, base = provisiond_http
    agent = {**busybox_agent(tmp_path), **fresh_token(base)}
    kept = tmp_path / "state-agent/etag"
    booted = run_agent(tmp_path, base, agent, "boot")
    assert booted.returncode == 0, booted.stderr
    assert "runtime overlay applied" in booted.stderr
    assert read_status(load_config(state), "n001")["phase"] == "ready"
    keys = host_key_dir(load_config(state), "n001")
    installed = tmp_path / "root/etc/ssh/ssh_host_ed25519_key"
    assert installed.read_text() == (keys / "ssh_host_ed25519_key").read_text()
    etag = provisiond_etag(base, tmp_path)
    assert kept.read_text().strip() == etag

    again = run_agent(tmp_path, base, agent, "refresh")
    assert again.returncode == 0, again.stderr
    assert "runtime overlay unchanged" in again.stderr  # the agent's words for HTTP 304
    assert "applied" not in again.stderr

    provisiond(state, "node", "set", "n001", "--ssh-key", NEW_KEY)
    provisiond(state, "overlay", "build")
    deadline = time.monotonic() + 15  # serve sees a rebuild within its snapshot interval
    while (changed := provisiond_etag(base, tmp_path)) == etag and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert changed != etag, "provisiond still serves the overlay from before the rebuild"
    fetched = run_agent(tmp_path, base, agent, "refresh")
    assert fetched.returncode == 0, fetched.stderr
    assert "runtime overlay applied" in fetched.stderr
    assert NEW_KEY in (tmp_path / "root/root/.ssh/authorized_keys").read_text()
    assert kept.read_text().strip() == changed


def test_agent_reports_the_nodes_memory_into_its_status(tmp_path, provisiond_http):
    """MemTotal and MemAvailable (busybox awk reading meminfo) reach the node's status."""
    state, base = provisiond_http
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        1024000 kB\nMemFree:          100 kB\n"
                       "MemAvailable:     700000 kB\n")
    agent = {**busybox_agent(tmp_path), **fresh_token(base), "PROVISIOND_MEMINFO": str(meminfo)}
    booted = run_agent(tmp_path, base, agent, "boot")
    assert booted.returncode == 0, booted.stderr
    status = status_document("n001", read_status(load_config(state), "n001"))
    assert status["phase"] == "ready"
    assert status["memory"] == {"total_kib": 1024000, "available_kib": 700000}


DELAYS = 10  # refresh waits the loop test lets the agent take (each 0-2 s)


def test_agent_loop_waits_interval_plus_bounded_jitter_between_refreshes(tmp_path,
                                                                        provisiond_http):
    """`loop` under busybox: every wait is INTERVAL + 0..JITTER s (0 + 0..2 here, so the test
    stays short) and not always the same; each wait is followed by a refresh (200, then
    304 from provisiond), with the credential `boot` got (its ETag dropped, so the loop's
    first refresh fetches the overlay again)."""
    _, base = provisiond_http
    booted = run_agent(tmp_path, base, {**busybox_agent(tmp_path), **fresh_token(base)},
                       "boot")
    assert booted.returncode == 0, booted.stderr
    (tmp_path / "state-agent/etag").unlink()
    env = dict(PROVISIOND_URL=base, PROVISIOND_NODE="n001", PATH="",
               PROVISIOND_AGENT_RUN=str(tmp_path / "run"),
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


def _runtime_body(files: dict[str, bytes]) -> bytes:
    from provisiond.archive import compress, file_entry, pack, with_parents

    return compress(pack(with_parents([file_entry(p, d, 0o400) for p, d in files.items()])),
                    "gzip")


class Systemctl:
    """A recording stand-in for systemctl (PROVISIOND_SYSTEMCTL): the agent's own choice of
    what to tell systemd is what is tested. `show -p RequiredBy` of the finish unit answers
    `required_by`, `is-enabled UNIT` answers `enabled` (UNIT: its state, else disabled)."""

    def __init__(self, tmp_path: Path, required_by: str = "", enabled: dict | None = None):
        self.calls = tmp_path / "systemctl.calls"
        self.path = tmp_path / "systemctl"
        answers = "".join(f"    *'is-enabled {unit}') echo {state} ;;\n"
                          for unit, state in (enabled or {}).items())
        self.path.write_text(
            f'#!/bin/sh\necho "$*" >>{self.calls}\ncase "$*" in\n'
            f"    'show -p RequiredBy --value provisiond-agent-finish.service') "
            f"echo {required_by} ;;\n{answers}"
            f"    'is-enabled '*) echo disabled; exit 1 ;;\nesac\n")
        self.path.chmod(0o755)
        self.env = {"PROVISIOND_SYSTEMCTL": str(self.path)}

    def taken(self) -> list[str]:
        """The calls since the last, and forget them."""
        if not self.calls.exists():
            return []
        calls = self.calls.read_text().splitlines()
        self.calls.unlink()
        return calls


def serve_runtime(server: NodeServer, files: dict[str, bytes]) -> None:
    server.body = _runtime_body(files)
    server.etag = f'"{hashlib.sha256(server.body).hexdigest()[:32]}"'


KEY, CONF, HOST_KEY = "etc/munge/munge.key", "etc/slurm/slurm.conf", "etc/ssh/ssh_host_ed25519_key"
SSH_RELOAD = "--no-block try-reload-or-restart ssh.service"
MUNGE_RESTART = "--no-block try-restart munge.service"
SLURMD_RELOAD = "--no-block try-reload-or-restart slurmd.service"


def test_a_refresh_restarts_only_the_services_whose_files_changed(tmp_path, server):
    """sshd rereads its host keys on a reload, munged reads its key only at start and slurmd
    rereads slurm.conf on a reload: a refresh that changed some of them tells systemd, one
    that changed none of them does not (queued: --no-block)."""
    systemctl = Systemctl(tmp_path)
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def refresh(files: dict[str, bytes], verb: str = "refresh") -> list[str]:
        serve_runtime(server, files)
        result = run_agent(tmp_path, url, systemctl.env, verb)
        assert result.returncode == 0, result.stderr
        return systemctl.taken()

    ssh = {HOST_KEY: b"h1"}
    # the boot installs them before sshd, munged and slurmd start (they are ordered after it)
    assert refresh({**ssh, KEY: b"k" * 32, CONF: b"ClusterName=a\n"}, "boot") == []
    assert refresh({**ssh, KEY: b"k" * 32, CONF: b"ClusterName=b\n"}) == [SLURMD_RELOAD]
    assert refresh({**ssh, KEY: b"m" * 32, CONF: b"ClusterName=b\n"}) == [MUNGE_RESTART]
    assert refresh({HOST_KEY: b"h2", KEY: b"m" * 32, CONF: b"ClusterName=b\n"}) == [SSH_RELOAD]
    assert refresh({HOST_KEY: b"h2", KEY: b"m" * 32, CONF: b"ClusterName=b\n",
                    "etc/motd": b"hi\n"}) == []
    assert (tmp_path / "root" / KEY).read_bytes() == b"m" * 32


def test_boot_start_run_again_has_the_running_services_pick_up_changed_files(tmp_path, server):
    """`systemctl restart provisiond-agent` (or any later boot-start of the same boot) that
    installs changed host keys, munge key, slurm.conf does what a refresh does (try-: only
    services already running); the boot's first boot-start asks systemd nothing (nothing
    reading them runs yet: sshd, munged and slurmd are ordered after it). Queued
    (--no-block): a job of sshd or munged waits for provisiond-agent.service, whose
    boot-start would wait for systemctl."""
    systemctl = Systemctl(tmp_path)
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def boot_start(files: dict[str, bytes]) -> list[str]:
        serve_runtime(server, files)
        result = run_agent(tmp_path, url, systemctl.env, "boot-start")
        assert result.returncode == 0, result.stderr
        return systemctl.taken()

    first = {HOST_KEY: b"h1", KEY: b"k" * 32, CONF: b"ClusterName=a\n"}
    assert boot_start(first) == []  # the boot's first: every file new, nothing asked
    assert boot_start(first) == []  # again, unchanged (304)
    assert boot_start({**first, HOST_KEY: b"h2", KEY: b"m" * 32, CONF: b"ClusterName=b\n"}) \
        == [SSH_RELOAD, MUNGE_RESTART, SLURMD_RELOAD]
    assert boot_start({HOST_KEY: b"h2", KEY: b"m" * 32, CONF: b"ClusterName=c\n"}) == \
        [SLURMD_RELOAD]
    assert (tmp_path / "root" / CONF).read_bytes() == b"ClusterName=c\n"
    assert [p for p, _ in server.phases] == ["booted", "runtime"] * 4


def test_a_change_a_failed_refresh_installed_is_acted_on_by_the_next(tmp_path, server):
    """A refresh that installed the new munge key but not every file fails and tells systemd
    nothing; the next one finds the key in place already (unchanged by it) and installs the
    rest. The files changed are kept until acted on: the list was emptied by each refresh,
    so munged was never restarted and ran on the old key until a reboot."""
    systemctl = Systemctl(tmp_path)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    files = {HOST_KEY: b"h1", KEY: b"k" * 32, CONF: b"ClusterName=a\n"}
    serve_runtime(server, files)
    assert run_agent(tmp_path, url, systemctl.env, "boot").returncode == 0
    assert systemctl.taken() == []
    blocker = tmp_path / "root/etc/slurm"
    shutil.rmtree(blocker)
    blocker.write_text("a file where a directory must go\n")
    serve_runtime(server, {**files, KEY: b"m" * 32, CONF: b"ClusterName=b\n"})
    failed = run_agent(tmp_path, url, {**systemctl.env, "PROVISIOND_AGENT_TRIES": "1"},
                       "refresh")
    assert failed.returncode == 1 and "cannot install /etc/slurm/slurm.conf" in failed.stderr
    assert (tmp_path / "root" / KEY).read_bytes() == b"m" * 32 and systemctl.taken() == []
    blocker.unlink()
    assert run_agent(tmp_path, url, systemctl.env, "refresh").returncode == 0
    assert systemctl.taken() == [MUNGE_RESTART, SLURMD_RELOAD]
    assert run_agent(tmp_path, url, systemctl.env, "refresh").returncode == 0  # 304
    serve_runtime(server, {**files, KEY: b"m" * 32, CONF: b"ClusterName=c\n"})
    assert run_agent(tmp_path, url, systemctl.env, "refresh").returncode == 0
    assert systemctl.taken() == [SLURMD_RELOAD]  # acted on once, not again


@pytest.mark.parametrize("timeout", ["coreutils", "busybox"])
def test_a_configure_run_that_ignores_term_is_killed_after_the_grace(tmp_path, server,
                                                                     timeout):
    """PROVISIOND_CONFIGURE_TIMEOUT ends a run with TERM; a run that traps it (a playbook's
    command that ignores it) is killed PROVISIOND_AGENT_KILL_AFTER s later, and reported
    failed as timed out, with coreutils' timeout and busybox's (the tiny image's: -k since
    1.35). Without the KILL it ran on to its end (here 20 s, then 'survived')."""
    url = f"http://127.0.0.1:{server.server_address[1]}"
    log = tmp_path / "configure.out"
    configure = tmp_path / "provisiond-configure"
    configure.write_text(f"#!/bin/sh\ntrap 'echo TERM ignored >>{log}' TERM\n"
                         f"echo $$ >{log}\nn=0\nwhile [ $n -lt 40 ]; do sleep 0.5; "
                         f"n=$((n + 1)); done\necho survived >>{log}\n")
    configure.chmod(0o755)
    extra = {"PROVISIOND_AGENT_CONFIGURE": str(configure), "PROVISIOND_AGENT_TRIES": "1",
             "PROVISIOND_CONFIGURE_TIMEOUT": "1", "PROVISIOND_AGENT_KILL_AFTER": "1"}
    if timeout == "busybox":
        if not tool("busybox"):
            pytest.skip("busybox-static is not installed")
        extra.update(busybox_agent(tmp_path))
    assert run_agent(tmp_path, url, extra, "boot-start").returncode == 0
    finished = run_agent(tmp_path, url, extra, "boot-finish")
    assert finished.returncode == 1, finished.stderr
    said = log.read_text().splitlines()
    assert said[1:] == ["TERM ignored"], said  # TERM came, was ignored, KILL ended it
    assert server.phases[-1][0] == "failed"
    assert server.phases[-1][1].startswith("provisiond-configure timed out after 1 s"), \
        server.phases[-1]


def test_with_a_timeout_without_kill_the_agent_still_bounds_its_commands(tmp_path, server):
    """An older busybox's timeout has no -k (usage, exit 1, the command not run): the agent
    then bounds with TERM only, as before, rather than run nothing."""
    bin_dir = tmp_path / "old-timeout"
    bin_dir.mkdir()
    (bin_dir / "timeout").write_text(
        f'#!/bin/sh\ncase "$1" in -k) echo "usage: timeout SECS PROG" >&2; exit 1 ;; esac\n'
        f'exec {tool("timeout")} "$@"\n')
    (bin_dir / "timeout").chmod(0o755)
    configure = tmp_path / "provisiond-configure"
    configure.write_text("#!/bin/sh\nexec sleep 30\n")
    configure.chmod(0o755)
    extra = {"PROVISIOND_AGENT_CONFIGURE": str(configure), "PROVISIOND_AGENT_TRIES": "1",
             "PROVISIOND_CONFIGURE_TIMEOUT": "1", "PATH": f"{bin_dir}:{SYSTEM_PATH}"}
    assert run_agent(tmp_path, url := f"http://127.0.0.1:{server.server_address[1]}", extra,
                     "boot-start").returncode == 0
    finished = run_agent(tmp_path, url, extra, "boot-finish")
    assert finished.returncode == 1, finished.stderr
    assert server.phases[-1][1].startswith("provisiond-configure timed out after 1 s"), \
        server.phases[-1]


@pytest.mark.parametrize("slurmd", ["enabled", "disabled"])
def test_a_configure_run_that_goes_well_after_the_boots_failed_starts_what_it_held(
        tmp_path, server, slurmd):
    """slurmd Requires= provisiond-agent-finish.service: after the boot's configure run
    failed it did not start, and a later run of the timer that went well reported ready
    with slurmd down until a reboot. Starting slurmd alone would start the failed finish
    unit again first, and so the whole configure run: the later run records its success
    (boot-finish then ends at once, reporting nothing) and has systemd start the finish unit
    with the enabled units requiring it (queued). Never while the runs fail, never once the
    finish unit went well."""
    systemctl = Systemctl(tmp_path, required_by="slurmd.service",
                          enabled={"slurmd.service": slurmd})
    url = f"http://127.0.0.1:{server.server_address[1]}"
    runs = tmp_path / "configure-runs"
    configure = tmp_path / "provisiond-configure"

    def configure_exits(status: int) -> None:
        configure.write_text(f"#!/bin/sh\necho run >>{runs}\necho 'PLAY RECAP'\nexit {status}\n")
        configure.chmod(0o755)

    extra = {**systemctl.env, "PROVISIOND_AGENT_CONFIGURE": str(configure),
             "PROVISIOND_AGENT_TRIES": "1"}
    finish_start = ["show -p RequiredBy --value provisiond-agent-finish.service",
                    "is-enabled slurmd.service",
                    "--no-block start provisiond-agent-finish.service"
                    + (" slurmd.service" if slurmd == "enabled" else "")]

    def phases() -> list[str]:
        taken = [p for p, _ in server.phases]
        server.phases.clear()
        return taken

    configure_exits(2)
    assert run_agent(tmp_path, url, extra, "boot-start").returncode == 0
    assert run_agent(tmp_path, url, extra, "boot-finish").returncode == 1
    assert run_agent(tmp_path, url, extra, "configure", "--only-if-changed").returncode == 1
    assert phases() == ["booted", "runtime", "failed", "failed"]
    assert systemctl.taken() == []  # a node whose runs fail: slurmd stays down
    configure_exits(0)
    fixed = run_agent(tmp_path, url, extra, "configure", "--only-if-changed")
    assert fixed.returncode == 0, fixed.stderr
    assert phases() == ["configured", "ready"]
    assert systemctl.taken() == finish_start
    assert runs.read_text().count("run") == 3
    finished = run_agent(tmp_path, url, extra, "boot-finish")  # as systemd starts it now
    assert finished.returncode == 0, finished.stderr
    assert runs.read_text().count("run") == 3 and phases() == []  # no second run, no report
    again = run_agent(tmp_path, url, extra, "configure")
    assert again.returncode == 0 and phases() == ["configured", "ready"]
    assert systemctl.taken() == []  # the finish unit went well: nothing held back


def test_a_failed_run_after_the_release_was_queued_holds_slurmd_again(tmp_path, server):
    """A later run went well and queued the finish unit's start (the marker that makes
    boot-finish end at once written), but that start did not happen (systemctl refused, the
    queue was flushed); then a run failed. `systemctl start slurmd` starts the finish unit
    first: its boot-finish must run the configure step again and fail, not take the old
    marker for a success and let slurmd start on a node whose last run failed."""
    systemctl = Systemctl(tmp_path, required_by="slurmd.service",
                          enabled={"slurmd.service": "enabled"})
    url = f"http://127.0.0.1:{server.server_address[1]}"
    configure = tmp_path / "provisiond-configure"

    def configure_exits(status: int) -> None:
        configure.write_text(f"#!/bin/sh\necho 'PLAY RECAP'\nexit {status}\n")
        configure.chmod(0o755)

    extra = {**systemctl.env, "PROVISIOND_AGENT_CONFIGURE": str(configure),
             "PROVISIOND_AGENT_TRIES": "1"}
    configure_exits(2)
    assert run_agent(tmp_path, url, extra, "boot-start").returncode == 0
    assert run_agent(tmp_path, url, extra, "boot-finish").returncode == 1
    configure_exits(0)
    assert run_agent(tmp_path, url, extra, "configure").returncode == 0  # release queued
    systemctl.taken()  # ... and never carried out
    configure_exits(2)
    assert run_agent(tmp_path, url, extra, "configure").returncode == 1
    server.phases.clear()
    finished = run_agent(tmp_path, url, extra, "boot-finish")  # systemctl start slurmd
    assert finished.returncode == 1, finished.stderr
    assert [p for p, _ in server.phases] == ["failed"]


def test_a_boot_whose_configure_run_went_well_starts_nothing_later(tmp_path, server):
    systemctl = Systemctl(tmp_path, required_by="slurmd.service",
                          enabled={"slurmd.service": "enabled"})
    url = f"http://127.0.0.1:{server.server_address[1]}"
    configure = tmp_path / "provisiond-configure"
    configure.write_text("#!/bin/sh\necho 'PLAY RECAP'\n")
    configure.chmod(0o755)
    extra = {**systemctl.env, "PROVISIOND_AGENT_CONFIGURE": str(configure)}
    for command in (["boot-start"], ["boot-finish"], ["configure"]):
        assert run_agent(tmp_path, url, extra, *command).returncode == 0
    assert [p for p, _ in server.phases] == ["booted", "runtime", "configured", "ready",
                                             "configured", "ready"]
    assert systemctl.taken() == []


UNIT_DIRS = [SHIPPED_DIR / "overlays/agent/etc/systemd/system",
             SHIPPED_DIR / "overlays/ansible-pull/etc/systemd/system"]
SLURMD_DROP_IN = SHIPPED_DIR / "images/debian12-compute/files/slurmd-provisiond.conf"


class Node:
    """The agent's units (and the ansible-pull overlay's) run by a real systemd, with the
    agent itself against `server` (ROOT, STATE and RUN in tmp_path; systemctl the real one),
    stand-ins for sshd, munged and slurmd (with the debian12-compute image's slurmd drop-in),
    all enabled as on a node; a provisiond-configure that exits `configure_status` and counts
    its runs."""

    def __init__(self, tmp_path: Path, server: NodeServer, configure_status: int):
        self.tmp, self.server = tmp_path, server
        units = tmp_path / "units"
        (units / "multi-user.target.wants").mkdir(parents=True)
        systemd_sandbox.write_targets(units)
        (units / "default.target").symlink_to("multi-user.target")
        env = tmp_path / "agent.env"
        env.write_text("".join(f"{k}={v}\n" for k, v in {
            "PROVISIOND_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "PROVISIOND_NODE": "n001", "PROVISIOND_TOKEN": TOKEN,
            "PROVISIOND_AGENT_RUN": tmp_path / "run", "PROVISIOND_AGENT_ROOT": tmp_path / "root",
            "PROVISIOND_AGENT_STATE": tmp_path / "state-agent", "PROVISIOND_AGENT_TRIES": 1,
            "PROVISIOND_AGENT_CONFIGURE": tmp_path / "provisiond-configure",
            "PROVISIOND_SYSTEMCTL": tool("systemctl"), "PATH": SYSTEM_PATH}.items()))
        for folder in UNIT_DIRS:
            for unit in folder.iterdir():
                text = unit.read_text().replace("/usr/local/sbin/provisiond-agent",
                                                f"{tool('sh')} {AGENT}")
                (units / unit.name).write_text(text)
                (units / f"{unit.name}.d").mkdir()
                (units / f"{unit.name}.d/test.conf").write_text(
                    f"[Service]\nEnvironmentFile={env}\n"
                    f"StandardOutput=append:{tmp_path / 'agent.log'}\n")
        for name in ("ssh", "munge", "slurmd"):
            (units / f"{name}.service").write_text(
                f"[Unit]\nDescription=stand-in {name}\n[Service]\n"
                f"ExecStart={tool('sleep')} infinity\n[Install]\nWantedBy=multi-user.target\n")
        (units / "slurmd.service.d").mkdir()
        (units / "slurmd.service.d/10-provisiond.conf").write_text(SLURMD_DROP_IN.read_text())
        for name in ("provisiond-agent", "provisiond-agent-finish", "ssh", "munge", "slurmd"):
            (units / f"multi-user.target.wants/{name}.service").symlink_to(
                f"../{name}.service")
        self.runs = tmp_path / "configure-runs"
        self.configure_exits(configure_status)
        self.systemd = systemd_sandbox.SystemdSandbox(units, tmp_path / "systemd.log")

    def configure_exits(self, status: int) -> None:
        configure = self.tmp / "provisiond-configure"
        configure.write_text(f"#!/bin/sh\necho run >>{self.runs}\necho 'PLAY RECAP'\n"
                             f"exit {status}\n")
        configure.chmod(0o755)

    def configure_runs(self) -> int:
        return self.runs.read_text().count("run") if self.runs.exists() else 0

    def state(self, unit: str) -> str:
        """The unit's state once systemd has no job queued."""
        return self.systemd.wait_for(unit, {"active", "inactive", "failed"})

    def main_pid(self, unit: str) -> str:
        return self.systemd.show(unit, "MainPID")

    def phases(self) -> list[str]:
        taken = [p for p, _ in self.server.phases]
        self.server.phases.clear()
        return taken


def serve_broken(server: NodeServer) -> None:
    """A runtime overlay that cannot be unpacked: boot-start fails as with the server away."""
    server.body, server.etag = b"not a runtime overlay", '"broken"'


@pytest.fixture
def boot_node(tmp_path, server):
    """boot_node(configure_status, server_away): a Node booted (its systemd stopped after the
    test), the server serving its runtime overlay (or, away, a broken one)."""
    if why := systemd_sandbox.missing():
        pytest.skip(f"a real systemd in namespaces: {why}")
    booted = []

    def boot(configure_status: int = 0, server_away: bool = False) -> Node:
        serve_runtime(server, {HOST_KEY: b"h1", KEY: b"k" * 32, CONF: b"ClusterName=a\n"})
        if server_away:
            serve_broken(server)
        booted.append(Node(tmp_path, server, configure_status))
        return booted[-1]

    yield boot
    for node in booted:
        node.systemd.stop()


def test_restarting_the_agent_unit_reruns_no_configure_run_and_leaves_slurmd_alone(boot_node):
    """`systemctl restart provisiond-agent` (boot-start again, to take a changed runtime
    overlay) restarts only what reads the files that changed. The finish unit had Requires=
    on it, which propagates a restart (systemd.unit(5)): the whole configure run ran again and
    slurmd (Requires= the finish unit) was restarted; and when that boot-start failed (the
    server away), slurmd was stopped and left down on a node that had been in service."""
    node = boot_node()
    assert node.state("slurmd.service") == "active"
    assert node.phases() == ["booted", "runtime", "configured", "ready"]
    assert node.configure_runs() == 1
    slurmd, munged = node.main_pid("slurmd.service"), node.main_pid("munge.service")
    serve_runtime(node.server, {HOST_KEY: b"h1", KEY: b"m" * 32, CONF: b"ClusterName=a\n"})
    node.systemd.systemctl("restart", "provisiond-agent.service")
    assert node.state("munge.service") == "active"
    assert node.main_pid("munge.service") != munged  # its key changed: restarted (queued)
    assert node.configure_runs() == 1 and node.phases() == ["booted", "runtime"]
    assert node.main_pid("slurmd.service") == slurmd
    assert node.state("provisiond-agent-finish.service") == "active"
    serve_broken(node.server)
    node.systemd.systemctl("restart", "provisiond-agent.service", check=False)
    assert node.state("provisiond-agent.service") == "failed"
    assert node.phases() == ["booted", "failed"]
    assert node.state("slurmd.service") == "active" and node.main_pid("slurmd.service") == slurmd


def test_a_failed_boot_start_runs_no_configure_run_and_starting_the_finish_unit_retries(
        boot_node, server):
    """A boot whose boot-start failed (the server away) has no configure run, no ready and
    no slurmd; `systemctl start provisiond-agent-finish` runs boot-start again first."""
    node = boot_node(server_away=True)
    assert node.state("provisiond-agent-finish.service") != "active"
    assert node.state("slurmd.service") == "inactive"
    assert node.phases() == ["booted", "failed"] and node.configure_runs() == 0
    serve_runtime(server, {HOST_KEY: b"h1", KEY: b"k" * 32, CONF: b"ClusterName=a\n"})
    node.systemd.systemctl("start", "provisiond-agent-finish.service")
    assert node.state("provisiond-agent.service") == "active"
    assert node.phases() == ["booted", "runtime", "configured", "ready"]


def test_a_later_configure_run_that_goes_well_starts_what_the_boots_failed_one_held(boot_node):
    """Under systemd itself: the boot's configure run failed, so slurmd (Requires= the finish
    unit) did not start; the ansible-pull unit's run that goes well starts the finish unit,
    which ends at once (no second run), and slurmd after it."""
    node = boot_node(configure_status=2)
    assert node.state("provisiond-agent-finish.service") == "failed"
    assert node.state("slurmd.service") == "inactive"
    assert node.phases() == ["booted", "runtime", "failed"] and node.configure_runs() == 1
    node.configure_exits(0)
    node.systemd.systemctl("start", "provisiond-ansible-pull.service")
    assert node.state("slurmd.service") == "active"
    assert node.state("provisiond-agent-finish.service") == "active"
    assert node.phases() == ["configured", "ready"] and node.configure_runs() == 2
