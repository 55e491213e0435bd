"""DNS with 10,000 names: provisiond's server vs dnsmasq under dnsperf (loopback only).

Prints both servers' qps and the ratio (target >= 0.5).
"""

from __future__ import annotations

import re
import subprocess
import sys

from bench_boot_common import (command, free_port, ip_of, make_state, serve, start, stop,
                               wait_for)

COUNT, SECONDS = 10_000, 10


def dnsperf(port: int, queries: str) -> float:
    out = subprocess.run(command(["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", queries,
                                  "-l", str(SECONDS), "-c", "4", "-q", "200", "-t", "2"]),
                         capture_output=True, text=True, timeout=SECONDS + 30).stdout
    lost = re.search(r"Queries lost:\s+(\d+)", out)
    print(out[out.find("Statistics"):].strip(), file=sys.stderr)
    qps = float(re.search(r"Queries per second:\s+([\d.]+)", out).group(1))
    return qps, int(lost.group(1)) if lost else -1


def answers(port: int) -> bool:
    result = subprocess.run(command(["dig", "+short", "+time=1", "+tries=1", "-p", str(port),
                                     "@127.0.0.1", "n1.cluster"]), capture_output=True, text=True)
    return result.stdout.strip() == ip_of(1)


def main() -> None:
    port_ours, port_peer = free_port(), free_port()
    state = make_state(COUNT, server={"domain": "cluster"},
                       dns={"enabled": True, "bind": "127.0.0.1", "port": port_ours})
    queries = state / "queries.txt"
    queries.write_text("".join(f"n{i}.cluster A\n" for i in range(1, COUNT + 1)))
    hosts = state / "hosts"
    hosts.write_text("".join(f"{ip_of(i)} n{i}.cluster n{i}\n" for i in range(1, COUNT + 1)))
    ours = serve(state, "--no-http", "--dns")
    peer = start(["dnsmasq", "-d", "-C", "/dev/null", "--no-resolv", "--no-hosts",
                  f"--addn-hosts={hosts}", f"--port={port_peer}", "--listen-address=127.0.0.1",
                  "--bind-interfaces", "--local=/cluster/", "--pid-file="],
                 log=str(state / "dnsmasq.log"))
    try:
        wait_for(lambda: answers(port_ours) and answers(port_peer))
        qps_ours, lost_ours = dnsperf(port_ours, str(queries))
        qps_peer, lost_peer = dnsperf(port_peer, str(queries))
    finally:
        stop(ours)
        stop(peer)
    print(f"dns {COUNT} names: provisiond {qps_ours:.0f} qps (lost {lost_ours}), "
          f"dnsmasq {qps_peer:.0f} qps (lost {lost_peer}), ratio {qps_ours / qps_peer:.2f} "
          f"(target >= 0.5)")


if __name__ == "__main__":
    main()
