"""DHCP with 10,000 reservations: provisiond vs dnsmasq under perfdhcp (kea-admin).

The servers run in a namespace, perfdhcp in another (it acts as a relay), joined by a veth
pair this script creates and removes. Prints 4-way exchanges/s (target >= 3,000).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from bench_boot_common import command, ip_of, mac_of, make_state, serve, start, stop

COUNT, SECONDS = 10_000, 10
RATE = 4000
SRV_NS, CLI_NS, SRV_IF, CLI_IF = "pvbdhcps", "pvbdhcpc", "pvbdhs", "pvbdhc"
SERVER, RELAY = "10.99.250.1", "10.99.250.2"


def ip(*args: str) -> None:
    subprocess.run(command(["ip", *args]), check=True)


def make_link() -> None:
    ip("netns", "add", SRV_NS)
    ip("netns", "add", CLI_NS)
    ip("-n", SRV_NS, "link", "add", SRV_IF, "type", "veth", "peer", "name", CLI_IF,
       "netns", CLI_NS)
    ip("-n", SRV_NS, "addr", "add", f"{SERVER}/16", "dev", SRV_IF)
    ip("-n", CLI_NS, "addr", "add", f"{RELAY}/16", "dev", CLI_IF)
    for ns, dev in ((SRV_NS, SRV_IF), (CLI_NS, CLI_IF)):
        ip("-n", ns, "link", "set", dev, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def drop_link() -> None:
    for ns in (SRV_NS, CLI_NS):
        subprocess.run(command(["ip", "netns", "del", ns]), capture_output=True)


def perfdhcp(macs: str) -> tuple[float, str]:
    perf = command(["perfdhcp", "-4", "-l", RELAY, "-r", str(RATE), "-p", str(SECONDS),
                    "-R", str(COUNT), "-M", macs, SERVER])
    out = subprocess.run(command(["ip", "netns", "exec", CLI_NS, *perf]), capture_output=True,
                         text=True, timeout=SECONDS + 60).stdout
    print(out, file=sys.stderr)
    rate = re.search(r"Rate: ([\d.]+) 4-way exchanges/second", out)
    drops = re.findall(r"drops: (\d+)", out)
    return (float(rate.group(1)) if rate else 0.0), "/".join(drops)


def run_peer(state, macs) -> tuple[float, str]:
    hosts = state / "dhcp-hosts"
    hosts.write_text("".join(f"{mac_of(i)},{ip_of(i)}\n" for i in range(1, COUNT + 1)))
    peer = start(["dnsmasq", "-d", "-C", "/dev/null", "--port=0", f"--interface={SRV_IF}",
                  "--bind-interfaces", "--dhcp-range=10.99.0.0,static,255.255.0.0",
                  f"--dhcp-hostsfile={hosts}", f"--dhcp-leasefile={state}/dnsmasq.leases",
                  "--dhcp-authoritative", "--quiet-dhcp", "--pid-file="], netns=SRV_NS)
    try:
        time.sleep(2)
        return perfdhcp(macs)
    finally:
        stop(peer)


def main() -> None:
    state = make_state(COUNT, server={"address": SERVER},
                       dhcp={"enabled": True, "interface": SRV_IF})
    macs = state / "macs.txt"
    macs.write_text("".join(f"{mac_of(i)}\n" for i in range(1, COUNT + 1)))
    drop_link()
    make_link()
    try:
        ours = serve(state, "--no-http", "--dhcp", netns=SRV_NS)
        try:
            rate_ours, drops_ours = perfdhcp(str(macs))
        finally:
            stop(ours)
        rate_peer, drops_peer = run_peer(state, str(macs))
    finally:
        drop_link()
    print(f"dhcp {COUNT} reservations: provisiond {rate_ours:.0f} exchanges/s (drops "
          f"{drops_ours}), dnsmasq {rate_peer:.0f} exchanges/s (drops {drops_peer}), "
          f"target >= 3000")


if __name__ == "__main__":
    RATE = int(sys.argv[1]) if len(sys.argv) > 1 else RATE
    main()
