"""`provisiond serve` in a child process against bad data, with real clients (dig, curl,
dhclient): hand-written inventories the CLI would refuse, and settings out of range."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootdata import ip_of, mac_of
from provisiond.config import write_default_config
from servers import (REPO, free_port, loopback_services, start_serve, stop_serve, wait_http,
                     write_config)
from tests.tools import command, tool

IPXE_ROOT = "/usr/lib/ipxe"


def run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(command(list(cmd)), capture_output=True, timeout=timeout, text=True)


def dig(port: int, *query: str) -> list[str]:
    return run("dig", "+short", "+time=2", "+tries=1", "-p", str(port), "@127.0.0.1",
               *query).stdout.split()


def inventory(*nodes: tuple[str, dict]) -> str:
    """inventory.yaml written by hand: no schema, no validation on the way in."""
    lines = ["nodes:"]
    for name, netdev in nodes:
        fields = ", ".join(f"{key}: '{value}'" for key, value in netdev.items())
        lines += [f"  {name}:", "    netdevs:", f"      eth0: {{{fields}}}"]
    return "\n".join(lines) + "\n"


def write_inventory(state: Path, text: str) -> None:
    tmp = state / "inventory.yaml.tmp"
    tmp.write_text(text)
    os.replace(tmp, state / "inventory.yaml")


def node(index: int, **extra) -> tuple[str, dict]:
    return f"n0{index}", {"mac": mac_of(index), "ipaddr": ip_of(index),
                          "ipaddr6": f"fd00::{index}", **extra}


def wait_log(state: Path, text: str, count: int = 1, timeout: float = 20) -> str:
    """The serve log once `text` occurs `count` times (the log is flushed every second)."""
    log = state / "serve.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if content.count(text) >= count:
            return content
        time.sleep(0.2)
    raise AssertionError(f"{text!r} x{count} not in the serve log:\n{content[-3000:]}")


@pytest.fixture
def loopback_state(tmp_path):
    state = tmp_path / "state"
    ports = loopback_services(state)
    return state, ports


def assert_all_services_answer(proc, ports: dict, tmp_path: Path) -> None:
    assert proc.poll() is None, "serve exited"
    assert dig(ports["dns"], "n01.cluster") == [ip_of(1)]
    out = tmp_path / "undionly.kpxe"
    fetched = run("curl", "-sS", "-o", str(out), f"tftp://127.0.0.1:{ports['tftp']}/undionly.kpxe")
    assert fetched.returncode == 0 and out.read_bytes() == Path(
        f"{IPXE_ROOT}/undionly.kpxe").read_bytes(), fetched.stderr
    script = run("curl", "-sSf", f"http://127.0.0.1:{ports['http']}/boot/ipxe")
    assert script.returncode == 0 and script.stdout.startswith("#!ipxe"), script.stderr


def test_a_bad_ipv6_record_stops_no_service(loopback_state, tmp_path):
    """`node set n03 --ipaddr6 fe80::1%eth0` (or 64:ff9b::10.0.0.5, ::ffff:10.0.0.5) was
    stored; with DNS on, `serve` then died at start with a traceback, or at the next reload,
    taking DHCP, TFTP, DNS and HTTP down. Now the record costs at most its own answers."""
    state, ports = loopback_state
    write_inventory(state, inventory(node(1), node(2), node(3, ipaddr6="fe80::1%eth0")))
    proc = start_serve(state)
    try:
        wait_http(f"http://127.0.0.1:{ports['http']}/boot/ipxe", proc)
        wait_log(state, "n03")  # skipped, or the file refused: either way one line
        assert_dns_soa(ports)
        write_inventory(state, inventory(node(1), node(2)))  # the fix, picked up live
        deadline = time.monotonic() + 15
        while dig(ports["dns"], "n01.cluster") != [ip_of(1)] and time.monotonic() < deadline:
            time.sleep(0.3)
        assert_all_services_answer(proc, ports, tmp_path)
        for bad in ["::ffff:10.0.0.5", "64:ff9b::10.0.0.5", "fe80::1%eth0",
                    "fd00::3%x\n10.66.66.66\tprovisiond.cluster"]:
            before = log_text(state).count("n03")
            write_inventory(state, inventory(node(1), node(2), node(3, ipaddr6=bad)))
            wait_reload(state, ports, before, bad)
            assert_all_services_answer(proc, ports, tmp_path)
        assert "Traceback" not in log_text(state)
    finally:
        stop_serve(proc)


def assert_dns_soa(ports: dict) -> None:
    assert dig(ports["dns"], "cluster", "SOA")[0] == "provisiond.cluster."


def log_text(state: Path) -> str:
    return (state / "serve.log").read_text(errors="replace")


def wait_reload(state: Path, ports: dict, before: int, bad: str) -> None:
    """Until serve has read the edit: a new line naming n03 (record skipped or file
    refused), or, for an address the schema may accept as it is, n03's AAAA answered."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if log_text(state).count("n03") > before:
            return
        if bad.startswith("64:ff9b") and dig(ports["dns"], "n03", "AAAA") == ["64:ff9b::a00:5"]:
            return
        time.sleep(0.3)
    raise AssertionError(f"serve did not report the edit with {bad!r}")


def test_a_hand_edit_duplicating_an_address_is_refused_and_the_last_table_kept(
        loopback_state):
    """A hand edit giving n02 the address of n01 made the server hand n02's runtime overlay
    (its ssh host keys) to n01 within 2 s. Now the edit is refused (one line, from the
    supervisor and from the HTTP worker) and n02's runtime overlay stays n02's (and would
    anyway: it needs n02's credential, 401 without)."""
    state, ports = loopback_state
    base = f"http://127.0.0.1:{ports['http']}"
    # n01 is the loopback client 127.0.0.2 (127.0.0.1 is the server's own address).
    n01 = ("n01", {"mac": mac_of(1), "ipaddr": "127.0.0.2"})
    write_inventory(state, inventory(n01, node(2)))
    proc = start_serve(state)
    try:
        wait_http(f"{base}/boot/ipxe", proc)
        runtime = f"{base}/overlays/n02/runtime"
        assert status(runtime) == "401"
        write_inventory(state, inventory(("n02", {**node(2)[1], "ipaddr": "127.0.0.2"}), n01))
        deadline = time.monotonic() + 20
        refusals = 0
        while refusals < 2 and time.monotonic() < deadline:
            assert status(runtime) == "401"  # was 200 within 2 s
            text = (state / "serve.log").read_text(errors="replace")
            refusals = text.count("127.0.0.2 is already used by node")
            time.sleep(0.2)
        assert refusals == 2, text[-2000:]  # the supervisor's line and the worker's
        assert status(runtime) == "401" and proc.poll() is None
        assert "keeping the last good table (2 nodes)" in text
    finally:
        stop_serve(proc)


def status(url: str) -> str:
    """The status n01 (at 127.0.0.2) gets for `url`."""
    return run("curl", "-s", "--interface", "127.0.0.2", "-o", "/dev/null", "-w",
               "%{http_code}", url).stdout


@pytest.mark.parametrize("section, value, message", [
    ("http", {"port": 70000}, "http.port: 70000 is outside 1-65535"),
    ("http", {"workers": 0}, "http.workers: 0 is outside 1-64"),
    ("dhcp", {"lease_seconds": -5}, "dhcp.lease_seconds: -5 is outside"),
    ("dns", {"ttl": -1}, "dns.ttl: -1 is outside"),
    ("server", {"domain": "a..b"}, "server.domain: 'a..b'"),
    ("tftp", {"enabled": True, "root": "/nonexistent/ipxe"},
     "tftp.root: /nonexistent/ipxe is not a readable directory"),
])
def test_a_bad_setting_is_one_line_before_anything_starts(tmp_path, section, value, message):
    """Each gave a traceback, a dead service, or (workers: 0) a server serving nothing."""
    state = tmp_path / "state"
    write_default_config(state)
    port = free_port()
    write_config(state, http={"bind": "127.0.0.1", "port": port})
    write_config(state, **{section: value})
    result = subprocess.run([sys.executable, "-m", "provisiond", "--state-dir", str(state),
                             "serve"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    with socket.socket() as probe:  # nothing was started: the port is still free
        probe.bind(("127.0.0.1", port))


def test_http_bind_ipv6_any_serves_ipv6_and_ipv4(tmp_path):
    """`http.bind: "::"` made gunicorn exit (it wants [::]:PORT)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    state = tmp_path / "state"
    write_default_config(state)
    port = free_port()
    write_config(state, http={"bind": "::", "port": port, "workers": 1})
    proc = start_serve(state)
    try:
        wait_http(f"http://[::1]:{port}/boot/ipxe", proc)
        assert run("curl", "-sSf", f"http://127.0.0.1:{port}/boot/ipxe").returncode == 0
    finally:
        stop_serve(proc)


@pytest.mark.netns
def test_dhclient_gets_its_lease_after_a_bad_record_is_loaded(tmp_path):
    """With DHCP and DNS on, a bad IPv6 record made the next reload end serve: DHCP went
    down with DNS. A real dhclient in a namespace still gets n02's reservation."""
    from netns import make_link
    from test_dhcp_netns import dhclient_lease

    if os.geteuid() != 0 or not tool("dhclient"):
        pytest.skip("needs root (network namespaces) and isc-dhcp-client")
    link = make_link("x")
    state = tmp_path / "state"
    write_default_config(state)
    write_config(state, server={"address": link.server_addr, "domain": "lab"},
                 dhcp={"enabled": True, "interface": link.server_if},
                 dns={"enabled": True, "bind": link.server_addr})
    write_inventory(state, inventory(node(1), node(2)))
    proc = start_serve(state, "--no-http", "--no-tftp", netns=link.server_ns)
    try:
        wait_log(state, "serving dhcp, dns")
        write_inventory(state, inventory(node(1), node(2), node(3, ipaddr6="::ffff:10.0.0.5")))
        wait_log(state, "n03")
        link.set_client_mac(mac_of(2))
        assert f"fixed-address {ip_of(2)};" in dhclient_lease(link, tmp_path)
        assert proc.poll() is None
    finally:
        stop_serve(proc)
        link.close()
