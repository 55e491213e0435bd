"""Proxy DHCP for real: `provisiond serve --dhcp --http` with dhcp.proxy true beside
dnsmasq (Debian's), which hands out the addresses, and iPXE as the client: the e1000 PXE ROM
of Debian's ipxe-qemu in QEMU (TCG), on a bridge in namespaces this test creates.

    server ns: br0 10.99.0.1 (provisiond: DHCP 67 + proxyDHCP 4011, HTTP)
    peer ns:   eth0 10.99.0.2 (dnsmasq: leases from 10.99.0.100-150, no boot options)
    client ns: brc = veth + tap0 (QEMU)

iPXE takes its address from dnsmasq's offer and the boot file from provisiond's proxy offer
on port 67, then fetches the iPXE script from provisiond over HTTP from the address dnsmasq
leased. The node has only a MAC in the inventory: in proxy mode the address is the other
server's business.

Not shown: an answer from port 4011. `serve` opens it (checked below), but iPXE sends its
ProxyDHCPREQUEST there only when the proxy offer lacks a next-server and boot file, and
provisiond's offer has both (iPXE src/net/udp/dhcp.c, dhcp_request_rx: "PXE options already
present; register settings without performing a ProxyDHCPREQUEST"). busybox udhcpc is no PXE
client either: it takes the first offer, and from a proxy offer it "leases" 0.0.0.0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from netns import in_netns
from provisiond.config import write_default_config
from servers import start_serve, stop_serve, write_config
from tests.tools import command, tool

pytestmark = [pytest.mark.netns, pytest.mark.slow]
MAC = "52:54:00:00:00:02"  # the VM's NIC; the node has no address in the inventory
SERVER, PEER = "10.99.0.1", "10.99.0.2"
LEASES = re.compile(r"10\.99\.0\.(1[0-4][0-9]|150)")


def ip(*args: str) -> None:
    subprocess.run(command(["ip", *args]), check=True, capture_output=True)


@pytest.fixture
def namespaces():
    """(server, peer, client) namespaces joined by the server's bridge; deleted after."""
    tag = os.getpid() % 10000
    names = (f"pxs{tag}", f"pxd{tag}", f"pxc{tag}")
    server, peer, client = names
    try:
        for name in names:
            ip("netns", "add", name)
            ip("-n", name, "link", "set", "lo", "up")
        bridge(server, "br0")
        ip("-n", server, "addr", "add", f"{SERVER}/16", "dev", "br0")
        for side, name in (("vd", peer), ("vc", client)):
            ip("-n", server, "link", "add", side, "type", "veth", "peer", "name", "eth0",
               "netns", name)
            ip("-n", server, "link", "set", side, "master", "br0", "up")
        ip("-n", peer, "addr", "add", f"{PEER}/16", "dev", "eth0")
        bridge(client, "brc")  # the veth's own MAC must not be the VM's: the bridge would
        ip("-n", client, "link", "set", "eth0", "address", "02:00:00:00:99:99")  # keep frames
        ip("-n", client, "tuntap", "add", "tap0", "mode", "tap")
        for dev in ("eth0", "tap0"):
            ip("-n", client, "link", "set", dev, "master", "brc", "up")
        ip("-n", peer, "link", "set", "eth0", "up")
        yield names
    finally:
        for name in names:
            subprocess.run(command(["ip", "netns", "del", name]), capture_output=True)


def bridge(netns: str, name: str) -> None:
    ip("-n", netns, "link", "add", name, "type", "bridge", "stp_state", "0",
       "forward_delay", "0")
    ip("-n", netns, "link", "set", name, "up")


def start(argv: list[str], netns: str, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(in_netns(netns, argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the session this test started for it
    proc.wait(10)


def wait_for(what: str, predicate, procs, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"exited while waiting for {what}: {dead}"
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
        time.sleep(0.5)


@pytest.mark.skipif(os.geteuid() != 0 or not all(map(tool, (
    "ip", "dnsmasq", "qemu-system-x86_64"))) or not Path("/usr/lib/ipxe/qemu/pxe-e1000.rom").exists(),
    reason="needs root, iproute2, dnsmasq-base, qemu-system-x86 and ipxe-qemu")
def test_ipxe_gets_its_lease_from_dnsmasq_and_its_boot_file_from_provisiond(namespaces,
                                                                           tmp_path):
    server, peer, client = namespaces
    state = tmp_path / "state"
    write_default_config(state)
    write_config(state, server={"address": SERVER, "domain": "lab"},
                 dhcp={"enabled": True, "proxy": True, "interface": "br0"},
                 http={"bind": SERVER, "port": 9873, "workers": 1})
    (state / "inventory.yaml").write_text(
        f"revision: 1\nnodes:\n  n2:\n    image: tiny\n    netdevs:\n"
        f"      eth0: {{mac: '{MAC}'}}\n")
    leases = tmp_path / "dnsmasq.leases"
    procs = [start_serve(state, "--dhcp", "--http", netns=server),
             start([tool("dnsmasq"), "-d", "-C", "/dev/null", "--port=0", "--user=root",
                    "--interface=eth0", "--bind-interfaces", "--pid-file=",
                    "--dhcp-range=10.99.0.100,10.99.0.150,255.255.0.0,10m",
                    f"--dhcp-leasefile={leases}", "--log-dhcp"], peer, tmp_path / "dnsmasq.log")]
    serial = tmp_path / "serial.log"
    serve_log = state / "serve.log"
    try:
        wait_for("provisiond serving", lambda: b" serving " in serve_log.read_bytes(), procs, 60)
        procs.append(start([tool("qemu-system-x86_64"), "-accel", "tcg", "-m", "128",
                            "-nographic", "-device", "sga", "-boot", "n", "-no-reboot",
                            "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
                            "-device", f"e1000,netdev=n0,mac={MAC}"], client, serial))
        fetched = re.compile(rf"n2 ipxe-script 200 .* from ({LEASES.pattern})$", re.M)
        wait_for("iPXE script request, or iPXE giving up",
                 lambda: fetched.search(serve_log.read_text()) or b"No bootable device" in
                 serial.read_bytes(), procs, 240)
    finally:
        for proc in reversed(procs[1:]):
            stop(proc)
        stop_serve(procs[0])
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", serial.read_text(errors="replace"))  # ANSI
    assert fetched.search(serve_log.read_text()), text[-1500:]
    leased = fetched.search(serve_log.read_text()).group(1)
    assert f"net0: {leased}/255.255.0.0 gw {PEER}" in text  # dnsmasq's lease and router
    assert "Filename: http://10.99.0.1:9873/boot/ipxe" in text  # provisiond's proxy offer
    assert f"{MAC} {leased} " in leases.read_text()  # dnsmasq: expiry MAC address ...
    assert "proxydhcp listening on 0.0.0.0:4011" in serve_log.read_text()
