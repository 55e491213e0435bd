"""/metrics of a real `provisiond serve` on loopback: the counters of all its processes
(DHCP, DNS and TFTP in serve's own, HTTP in two gunicorn workers, phases in the phase
writer) and the builds and BMC calls CLI processes recorded, read as Prometheus reads them."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from dnslib import DNSRecord

from loopback_node import prepare
from provisiond.config import load_config
from provisiond.state.layout import Layout
from servers import free_port, loopback_services, start_serve, stop_serve, wait_http, write_config
from tests.conftest import REPO, run_provisiond
from tests.prometheus_text import by_label, parse
from tests.tools import command
from tests.waits import wait_until

IPXE_ROOT = "/usr/lib/ipxe"
STALE = ("import os, sys; os.environ['PROMETHEUS_MULTIPROC_DIR'] = sys.argv[1]; "
         "from provisiond.metrics import count; "
         "count('http_requests', '/left-by-a-killed-serve', 'GET', '200', amount=1000)")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(config, ports, base URL, nodes) of a serve with HTTP (2 workers), DHCP, DNS, TFTP."""
    state = tmp_path_factory.mktemp("metrics") / "state"
    config, ports, _, nodes = prepare(state, 3, http={"workers": 2})
    stale = Layout.of(config).run / "metrics" / "999999999"  # a killed serve's: no lock held
    stale.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", STALE, str(stale)], cwd=REPO, check=True)
    proc = start_serve(state)
    base = f"http://127.0.0.1:{ports['http']}"
    try:
        wait_http(f"{base}/metrics", proc)
        assert not stale.exists(), "serve left a killed serve's directory"
        yield config, ports, base, nodes
    finally:
        stop_serve(proc)


def scrape(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        return parse(response.read().decode())


def scrape_until(base: str, ready, timeout: float = 15) -> dict:
    """The first scrape `ready` accepts (bounded)."""
    return wait_until(lambda: next((s for s in [scrape(base)] if ready(s)), None), timeout,
                      "the metrics counted everything")


def test_every_process_counts_into_one_metrics_page(served, tmp_path):
    config, ports, base, nodes = served
    # n1's boot: dhcp from the DHCP loop (serve's own process) and ipxe from its script
    # (a gunicorn worker), both recorded by the phase writer; booted its agent's report
    # (a worker), timed from dhcp
    nodes["n1"].dhcp()
    nodes["n1"].ipxe()
    nodes["n1"].report("booted")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dhcp:
        dhcp.sendto(b"not dhcp", ("127.0.0.1", ports["dhcp"]))
    for _ in range(10):  # new connections: both workers take some
        urllib.request.urlopen(f"{base}/boot/ipxe", timeout=10).read()
    # DNS and TFTP (serve's own process)
    DNSRecord.question("n3.cluster").send("127.0.0.1", ports["dns"], timeout=5)
    got = subprocess.run(command(["curl", "-sS", "-o", str(tmp_path / "undionly"),
                                  f"tftp://127.0.0.1:{ports['tftp']}/undionly.kpxe"]),
                         capture_output=True, timeout=30)
    assert got.returncode == 0, got.stderr
    subprocess.run(command(["curl", "-sS", "-o", "/dev/null",
                            f"tftp://127.0.0.1:{ports['tftp']}/no-such-file"]),
                   capture_output=True, timeout=30)
    # CLI processes: an overlay build and a BMC call
    assert run_provisiond(config.state_dir, "overlay", "build", "n3").returncode == 0
    assert run_provisiond(config.state_dir, "node", "set", "n3", "--bmc-driver", "fake",
                          "--bmc-address", "bmc").returncode == 0
    assert run_provisiond(config.state_dir, "power", "on", "n3").returncode == 0

    # The DHCP and DNS loops publish once a second, the phase writer catches up: wait until
    # the last count of each is there.
    last = {("provisiond_dhcp_errors_total", "kind"): "malformed",
            ("provisiond_dns_replies_total", "rcode"): "noerror",
            ("provisiond_tftp_requests_total", "outcome"): "refused_not_found",
            ("provisiond_boot_phases_total", "phase"): "ipxe"}
    seen = scrape_until(base, lambda s: all(value in by_label(s, *key)
                                            for key, value in last.items()))
    assert by_label(seen, "provisiond_dhcp_requests_total", "type") == {"discover": 1,
                                                                         "request": 1}
    assert by_label(seen, "provisiond_dhcp_replies_total", "type") == {"offer": 1, "ack": 1}
    assert by_label(seen, "provisiond_dhcp_errors_total", "kind") == {"malformed": 1}
    assert by_label(seen, "provisiond_dns_replies_total", "rcode") == {"noerror": 1}
    assert by_label(seen, "provisiond_tftp_transfers_total", "outcome") == {"complete": 1}
    assert seen["provisiond_tftp_sent_bytes_total", ()] == \
        (tmp_path / "undionly").stat().st_size
    assert by_label(seen, "provisiond_boot_phases_total", "phase") == {
        "dhcp": 1, "ipxe": 1, "booted": 1}
    assert seen["provisiond_boot_phase_seconds_count", (("phase", "ipxe"),)] == 1
    assert seen["provisiond_boot_phase_seconds_count", (("phase", "booted"),)] == 1
    requests = {labels: value for (name, labels), value in seen.items()
                if name == "provisiond_http_requests_total"}
    assert requests[("method", "GET"), ("route", "/boot/ipxe/<mac>"), ("status", "200")] == 1
    assert requests[("method", "GET"), ("route", "/boot/ipxe"), ("status", "200")] == 10
    assert requests[("method", "POST"), ("route", "/api/v1/credentials/<node>"),
                    ("status", "200")] == 1
    assert requests[("method", "POST"), ("route", "/api/v1/status/<node>"),
                    ("status", "200")] == 1
    assert seen["provisiond_build_duration_seconds_count",
                (("kind", "overlays"), ("outcome", "ok"))] == 1
    assert seen["provisiond_bmc_call_duration_seconds_count",
                (("driver", "fake"), ("outcome", "ok"))] == 1
    assert not any("/left-by-a-killed-serve" in dict(labels).get("route", "")
                   for _, labels in seen), "a killed serve's counts were read"


def test_the_run_directory_is_removed_when_serve_stops(tmp_path):
    state = tmp_path / "state"
    ports = loopback_services(state)
    proc = start_serve(state, "--no-dns", "--no-tftp")
    run = Layout.of(load_config(state)).run / "metrics"
    try:
        wait_http(f"http://127.0.0.1:{ports['http']}/metrics", proc)
        assert [entry.name for entry in run.iterdir()] != []
    finally:
        assert stop_serve(proc) == 0
    assert list(run.iterdir()) == []


def test_with_an_api_listener_of_its_own_metrics_count_both_listeners(tmp_path):
    """api.bind set: two gunicorns (boot, api) count into the one run directory; /metrics
    and the status page are the API listener's (404 on the boot network)."""
    state = tmp_path / "state"
    _, ports, _, nodes = prepare(state, 1)
    api_port = free_port()
    write_config(state, api={"bind": "127.0.0.1", "port": api_port})
    proc = start_serve(state, "--no-dns", "--no-tftp", "--no-dhcp")
    boot, api = f"http://127.0.0.1:{ports['http']}", f"http://127.0.0.1:{api_port}"
    try:
        wait_http(f"{api}/metrics", proc)
        wait_http(f"{boot}/boot/ipxe", proc)
        nodes["n1"].report("booted")  # script (boot listener), exchange and report (nodes')
        for path in ("/metrics", "/"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{boot}{path}", timeout=10)
            assert refused.value.code == 404
        assert urllib.request.urlopen(f"{api}/", timeout=10).status == 200
        seen = scrape_until(api, lambda s: ("provisiond_http_request_duration_seconds_count",
                                            (("route", "/"),)) in s)
    finally:
        stop_serve(proc)
    requests = {labels: value for (name, labels), value in seen.items()
                if name == "provisiond_http_requests_total"}
    assert requests[("method", "GET"), ("route", "/boot/ipxe/<mac>"), ("status", "200")] == 1
    assert requests[("method", "POST"), ("route", "/api/v1/status/<node>"),
                    ("status", "200")] == 1
    assert requests[("method", "GET"), ("route", "unmatched"), ("status", "404")] == 2
    assert seen["provisiond_boot_phases_total", (("phase", "booted"),)] == 1
