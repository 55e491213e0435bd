"""Tokens and credentials against a real `provisiond serve` across a veth pair between two
namespaces this test creates: the node's agent (curl, and busybox nc on an IPv6-only node)
gets its credential; the same token from another address of the node's network and again
from the node's own address is refused, each refusal an event; a status report without the
credential changes nothing; an unprivileged user on the node gets neither the credential
nor the runtime overlay, nor a credential for a token of their own."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from provisiond.config import load_config
from provisiond.events import read_since
from provisiond.status import read_status
from tests.conftest import run_provisiond
from tests.integration.boot.netns import ip, make_link
from tests.integration.boot.servers import start_serve, stop_serve, write_config
from tests.integration.test_overlays_agent import AGENT, SYSTEM_PATH
from tests.tools import tool
from tests.unit.boot.bootdata import add_image, token_in

pytestmark = pytest.mark.netns
SERVER, NODE, OTHER = "10.97.0.1", "10.97.0.2", "10.97.0.3"
SERVER6, NODE6 = "fd97::1", "fd97::6"
MAC, MAC6 = "52:54:00:97:00:02", "52:54:00:97:00:06"
URL, URL6 = f"http://{SERVER}:9873", f"http://[{SERVER6}]:9873"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


@pytest.fixture(scope="module")
def lan(tmp_path_factory):
    """(link, state dir) with serve on the server side (10.97.0.1, fd97::1) and, on the
    client side, node n1's address, another address, and IPv6-only node n6's address."""
    if os.geteuid() != 0 or not all(tool(t) for t in ("ip", "busybox", "curl", "setpriv")):
        pytest.skip("needs root (network namespaces), iproute2, busybox, curl, setpriv")
    link = make_link("t", f"{SERVER}/24")
    state = tmp_path_factory.mktemp("trust") / "state"
    proc = None
    try:
        for ns, dev, address in ((link.client_ns, link.client_if, f"{NODE}/24"),
                                 (link.client_ns, link.client_if, f"{OTHER}/24")):
            ip("-n", ns, "addr", "add", address, "dev", dev)
        ip("-n", link.server_ns, "addr", "add", f"{SERVER6}/64", "dev", link.server_if, "nodad")
        ip("-n", link.client_ns, "addr", "add", f"{NODE6}/64", "dev", link.client_if, "nodad")
        provisiond(state, "init", "--address", SERVER)
        write_config(state, http={"bind": "::", "port": 9873, "workers": 2})
        provisiond(state, "node", "add", "n1", "--ipaddr", NODE, "--mac", MAC)
        provisiond(state, "node", "add", "n6", "--ipaddr6", NODE6, "--mac", MAC6)
        add_image(load_config(state), "tiny")
        provisiond(state, "overlay", "build")
        proc = start_serve(state, "--http", netns=link.server_ns)
        wait_for(lambda: fetch(link, f"{URL}/boot/ipxe").returncode == 0, proc)
        yield link, state
    finally:
        if proc is not None:
            stop_serve(proc)
        link.close()


def provisiond(state: Path, *args: str) -> None:
    done = run_provisiond(state, *args)
    assert done.returncode == 0, done.stderr


def wait_for(check, proc, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert proc.poll() is None, "provisiond serve exited"
        assert time.monotonic() < deadline, f"not up after {seconds} s"
        time.sleep(0.3)


def fetch(link, url: str, *curl: str, user: list[str] = ()) -> subprocess.CompletedProcess:
    """curl on the node's side (as `user`, e.g. NOBODY), output and HTTP code."""
    return link.client(*user, tool("curl"), "-gsS", "--max-time", "20", "-w", "\n%{http_code}",
                       *curl, url, text=True)


def code_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout.rsplit("\n", 1)[-1]


def script_token(link, mac: str, url: str = URL, user: list[str] = ()) -> str:
    return token_in(fetch(link, f"{url}/boot/ipxe/{mac}", user=user).stdout)


def agent(link, run: Path, url: str, node: str, token: str, http: str
          ) -> subprocess.CompletedProcess:
    """The agent's `boot` as root on the node's side."""
    env = {"PROVISIOND_URL": url, "PROVISIOND_NODE": node, "PROVISIOND_TOKEN": token,
           "PROVISIOND_AGENT_RUN": str(run / "run"), "PROVISIOND_AGENT_ROOT": str(run / "root"),
           "PROVISIOND_AGENT_STATE": str(run / "state"), "PROVISIOND_AGENT_HTTP": http,
           "PROVISIOND_AGENT_TRIES": "2", "PATH": SYSTEM_PATH}
    shell = [tool("busybox"), "sh"] if http == "nc" else [tool("sh")]
    return link.client(*shell, str(AGENT), "boot", env=env, text=True, timeout=120)


def refusals(state: Path) -> list[tuple]:
    return [(e.subject, e.data["reason"], e.data["address"])
            for e in read_since(load_config(state), 0) if e.kind == "token.refused"]


@pytest.fixture
def node_dir():
    """A directory others may enter (/tmp/...: 0755), where the agent makes its own."""
    folder = Path(f"/tmp/provisiond-trust-{os.getpid()}")
    folder.mkdir(mode=0o755)
    try:
        yield folder
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=True)


def test_the_same_token_from_another_address_and_again_from_the_node_is_refused(lan, node_dir):
    link, state = lan
    token = script_token(link, MAC)
    booted = agent(link, node_dir, URL, "n1", token, "curl")
    assert booted.returncode == 0, booted.stderr
    config = load_config(state)
    assert read_status(config, "n1")["phase"] == "ready"
    assert (node_dir / "root/etc/ssh/ssh_host_ed25519_key").is_file()
    post = ("--local-port", "700-800", "--data", f"token={token}")
    stranger = fetch(link, f"{URL}/api/v1/credentials/n1", "--interface", OTHER, *post)
    assert code_of(stranger) == "401" and "not reserved for the node" in stranger.stdout
    again = fetch(link, f"{URL}/api/v1/credentials/n1", "--interface", NODE, *post)
    assert code_of(again) == "401" and "used already" in again.stdout
    assert refusals(state)[-2:] == [("n1", "wrong_address", OTHER), ("n1", "reused", NODE)]
    assert read_status(config, "n1")["token_refused"]["reason"] == "reused"

    before = read_status(config, "n1")
    forged = fetch(link, f"{URL}/api/v1/status/n1", "--interface", NODE, "--data",
                   "phase=failed&detail=forged")
    assert code_of(forged) == "401"
    assert read_status(config, "n1") == before


def test_an_unprivileged_user_on_the_node_gets_no_credential_and_no_runtime_overlay(
        lan, node_dir):
    link, state = lan
    assert agent(link, node_dir, URL, "n1", script_token(link, MAC), "curl").returncode == 0
    stolen = link.client(*NOBODY, tool("cat"), str(node_dir / "run/credential"), text=True)
    assert stolen.returncode != 0 and "Permission denied" in stolen.stderr
    assert code_of(fetch(link, f"{URL}/overlays/n1/runtime", "-o", "/dev/null",
                         user=NOBODY)) == "401"
    own = script_token(link, MAC, user=NOBODY)  # anyone may fetch a script: a new token
    refused = fetch(link, f"{URL}/api/v1/credentials/n1", "--data", f"token={own}",
                    user=NOBODY)
    assert code_of(refused) == "401" and "below 1024" in refused.stdout
    assert refusals(state)[-1] == ("n1", "unprivileged_port", NODE)
    bind = fetch(link, f"{URL}/api/v1/credentials/n1", "--local-port", "700-710", "--data",
                 f"token={own}", user=NOBODY)
    assert bind.returncode == 45, bind.stderr  # curl: cannot bind the local port
    listen = link.client(*NOBODY, tool("busybox"), "nc", "-l", "-p", "702", text=True,
                         timeout=10)
    assert listen.returncode != 0  # nor listen on one, for a callback


def test_an_ipv6_only_node_with_busybox_gets_its_runtime_overlay(lan, node_dir):
    link, state = lan
    booted = agent(link, node_dir, URL6, "n6", script_token(link, MAC6, URL6), "nc")
    assert booted.returncode == 0, booted.stderr
    assert "node credential received" in booted.stderr
    assert read_status(load_config(state), "n6")["phase"] == "ready"
    assert (node_dir / "root/etc/ssh/ssh_host_ed25519_key").is_file()
    assert oct((node_dir / "run/credential").stat().st_mode & 0o777) == "0o600"
