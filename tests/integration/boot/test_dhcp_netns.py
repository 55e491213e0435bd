"""Real DHCP clients (busybox udhcpc, ISC dhclient) against `provisiond serve` across a
veth pair between two namespaces this test creates."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from bootdata import add_nodes, ip_of, mac_of
from netns import make_link
from provisiond.boot.discovery import read_discovery
from provisiond.config import load_config, write_default_config
from provisiond.status import read_status
from servers import start_serve, stop_serve, write_config
from tests.tools import tool

pytestmark = pytest.mark.netns
SCRIPT = """#!/bin/sh
[ "$1" = bound ] || exit 0
printf '{"ip":"%s","subnet":"%s","router":"%s","dns":"%s","domain":"%s","hostname":"%s",\
"boot_file":"%s","siaddr":"%s"}\\n' "$ip" "$subnet" "$router" "$dns" "$domain" "$hostname" \
"$boot_file" "$siaddr" > "$OUT"
"""


@pytest.fixture(scope="module")
def dhcp_link(tmp_path_factory):
    if os.geteuid() != 0 or not tool("ip") or not tool("busybox"):
        pytest.skip("needs root (network namespaces), iproute2 and busybox")
    tmp = tmp_path_factory.mktemp("dhcp")
    link = make_link("d")
    state = tmp / "state"
    write_default_config(state)
    write_config(state, server={"address": link.server_addr, "domain": "lab"},
                 http={"port": 9873},
                 dhcp={"enabled": True, "interface": link.server_if, "lease_seconds": 600,
                       "discovery": True},
                 dns={"enabled": True, "bind": link.server_addr})
    config = load_config(state)
    add_nodes(config, 5, gateway="10.99.0.1")
    proc = start_serve(state, "--no-http", "--no-tftp", netns=link.server_ns)
    script = tmp / "udhcpc.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    wait_serving(state / "serve.log", proc)
    try:
        yield link, config, script, tmp
    finally:
        stop_serve(proc)
        link.close()


def wait_serving(log: Path, proc, seconds: float = 30) -> None:
    """Until serve logs that DHCP is served (it logs so once its sockets are bound)."""
    deadline = time.monotonic() + seconds
    while "serving dhcp" not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"serve exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"serve not up after {seconds} s"
        time.sleep(0.1)


def udhcpc(link, script, out, *extra: str):
    result = link.client("busybox", "udhcpc", "-i", link.client_if, "-f", "-q", "-n", "-t", "4",
                         "-T", "2", "-s", str(script), *extra, env={"OUT": str(out)})
    return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("index,extra,bootfile", [
    (1, ["-x", "0x5d:0000"], "undionly.kpxe"),
    (2, ["-x", "0x5d:0007", "-V", "PXEClient:Arch:00007:UNDI:003016"], "snponly.efi"),
    (3, ["-x", "0x5d:0009"], "snponly.efi"),
    (4, ["-x", "0x4d:69505845"], "http://10.99.0.1:9873/boot/ipxe"),
    (5, ["-x", "0x5d:0010", "-V", "HTTPClient:Arch:00016:UNDI:003001"],
     "http://10.99.0.1:9873/boot/files/ipxe.efi"),
])
def test_udhcpc_gets_reservation_and_boot_file(dhcp_link, index, extra, bootfile):
    link, config, script, tmp = dhcp_link
    link.set_client_mac(mac_of(index))
    result, lease = udhcpc(link, script, tmp / f"lease{index}.json", *extra)
    assert result.returncode == 0, result.stderr
    assert lease["ip"] == ip_of(index) and lease["subnet"] == "255.255.0.0"
    assert lease["router"] == "10.99.0.1" and lease["dns"] == "10.99.0.1"
    assert lease["hostname"] == f"n{index}" and lease["domain"] == "lab"
    assert lease["boot_file"] == bootfile and lease["siaddr"] == "10.99.0.1"
    deadline = time.monotonic() + 15  # the phase writer is niced: slow on a busy machine
    while not read_status(config, f"n{index}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert read_status(config, f"n{index}")["phase"] == "dhcp"


def stop_dhclient(pidfile) -> None:
    """dhclient stays in the background once bound; its pid file may still be empty."""
    deadline = time.monotonic() + 5
    while pidfile.exists() and time.monotonic() < deadline:
        pid = pidfile.read_text().strip()
        if pid:
            os.kill(int(pid), signal.SIGTERM)
            return
        time.sleep(0.05)


def dhclient_lease(link, folder) -> str:
    """Run dhclient once on the link's client side; the lease file it wrote (it must bind)."""
    leases, pidfile = folder / "dhclient.leases", folder / "dhclient.pid"
    try:
        result = link.client("dhclient", "-1", "-v", "-sf", "/bin/true", "-lf", str(leases),
                             "-pf", str(pidfile), link.client_if, timeout=40)
    finally:
        stop_dhclient(pidfile)
    assert result.returncode == 0, result.stderr
    return leases.read_text()


def test_dhclient_gets_reservation(dhcp_link):
    link, _, _, tmp = dhcp_link
    if not tool("dhclient"):
        pytest.skip("isc-dhcp-client not installed")
    link.set_client_mac(mac_of(2))
    text = dhclient_lease(link, tmp)
    assert f"fixed-address {ip_of(2)};" in text and 'option host-name "n2";' in text


def test_unknown_mac_gets_nothing_and_is_discovered(dhcp_link):
    link, config, script, tmp = dhcp_link
    link.set_client_mac("02:aa:bb:cc:dd:ee")
    result, lease = udhcpc(link, script, tmp / "unknown.json", "-x", "0x5d:0007")
    assert result.returncode != 0 and lease is None
    events = [e for e in read_discovery(config) if e["mac"] == "02:aa:bb:cc:dd:ee"]
    assert len(events) == 1 and events[0]["arch"] == 7


def test_a_node_added_while_serving_gets_its_address(dhcp_link):
    link, config, script, tmp = dhcp_link
    add_nodes(config, 6, gateway="10.99.0.1")  # n6 is new; serve reloads within a second or so
    link.set_client_mac(mac_of(6))
    deadline, lease = time.monotonic() + 20, None
    while lease is None and time.monotonic() < deadline:
        _, lease = udhcpc(link, script, tmp / "lease6.json", "-x", "0x5d:0000")
    assert lease["ip"] == ip_of(6) and lease["hostname"] == "n6"
