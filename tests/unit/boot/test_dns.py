"""The DNS server in-process on loopback: precomputed answers, misses, forwarding."""

from __future__ import annotations

import socket

import pytest
from dnslib import DNSRecord, QTYPE, RCODE

from bootdata import add_nodes, ip_of
from provisiond.boot.dns import DnsServer
from provisiond.boot.table import build_table
from provisiond.boot.udp import open_udp
from provisiond.config import load_config
from tests.prometheus_text import by_label
from tests.waits import wait_until


def start(config) -> DnsServer:
    server = DnsServer(config, build_table(config), sock=open_udp("127.0.0.1", 0))
    server.start()
    return server


def start_upstream(folder, sock) -> DnsServer:
    """An upstream DNS server answering for domain `other` (n1, n2 in 10.77) on `sock`."""
    folder.mkdir()
    (folder / "provisiond.yaml").write_text("server:\n  domain: other\n")
    config = load_config(folder)
    add_nodes(config, 2, net="10.77")
    upstream = DnsServer(config, build_table(config), sock=sock)
    upstream.start()
    return upstream


@pytest.fixture
def dns(config):
    add_nodes(config, 4)
    server = start(config)
    yield server
    server.close()


def ask(server, name: str, qtype: str = "A") -> DNSRecord:
    query = DNSRecord.question(name, qtype)
    host, port = server.sock.getsockname()
    return DNSRecord.parse(query.send(host, port, timeout=2))


def test_answers_match_the_query_and_keep_its_case(dns):
    reply = ask(dns, "N2.CLUSTER")
    assert reply.header.aa and reply.header.rcode == RCODE.NOERROR
    assert str(reply.q.qname) == "N2.CLUSTER." and str(reply.rr[0].rdata) == ip_of(2)
    assert str(ask(dns, "n2", "AAAA").rr[0].rdata) == "fd00::2"
    assert str(ask(dns, "3.0.99.10.in-addr.arpa", "PTR").rr[0].rdata) == "n1.cluster."


def test_misses_in_the_zone(dns):
    assert ask(dns, "zz.cluster").header.rcode == RCODE.NXDOMAIN
    nodata = ask(dns, "n1.cluster", "MX")
    assert nodata.header.rcode == RCODE.NOERROR and not nodata.rr
    assert nodata.auth[0].rtype == QTYPE.SOA
    assert ask(dns, "example.org").header.rcode == RCODE.NXDOMAIN


def test_other_names_are_forwarded_upstream(state_dir, tmp_path, dns):
    upstream = start_upstream(tmp_path / "up", open_udp("127.0.0.1", 0))
    host, port = upstream.sock.getsockname()
    (state_dir / "provisiond.yaml").write_text(f"dns:\n  upstream: '{host}:{port}'\n")
    config = load_config(state_dir)
    server = start(config)
    try:
        reply = ask(server, "n2.other")
        assert str(reply.rr[0].rdata) == ip_of(2, "10.77")
        assert str(ask(server, "n2.cluster").rr[0].rdata) == ip_of(2)
    finally:
        server.close()
        upstream.close()



def test_upstream_on_ipv6(state_dir, tmp_path, dns):
    """`[::1]:port` is an IPv6 upstream (it was taken for a host name on port 53)."""
    upstream = start_upstream(tmp_path / "up", open_udp("::1", 0))
    port = upstream.sock.getsockname()[1]
    (state_dir / "provisiond.yaml").write_text(f"dns:\n  upstream: '[::1]:{port}'\n")
    try:
        server = start(load_config(state_dir))
        try:
            assert str(ask(server, "n2.other").rr[0].rdata) == ip_of(2, "10.77")
        finally:
            server.close()
    finally:
        upstream.close()


@pytest.mark.parametrize("upstream", ["10.0.0.1:dns", "10.0.0.1:70000", "[::1"])
def test_a_bad_upstream_is_one_invalid_input_line(state_dir, upstream):
    """Refused when the settings load, before any socket opens."""
    from provisiond.errors import InvalidInput

    (state_dir / "provisiond.yaml").write_text(f"dns:\n  upstream: '{upstream}'\n")
    with pytest.raises(InvalidInput, match="dns.upstream: not"):
        load_config(state_dir)


def test_forwarder_uses_unused_ids_and_bounds_queries_in_flight():
    import socket as _socket

    from provisiond.boot import dns as dns_module

    sink = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    reply = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    forwarder = dns_module.Forwarder(sink.getsockname(), reply)
    try:
        query = b"\x12\x34" + b"\x00" * 10
        for _ in range(dns_module.MAX_PENDING + 10):
            forwarder.forward(query, ("127.0.0.1", 9))
        assert len(forwarder.pending) == dns_module.MAX_PENDING  # ids unique, the rest dropped
    finally:
        forwarder.close()
        sink.close()
        reply.close()


def test_forwarding_resumes_once_a_dead_upstream_is_back(state_dir, tmp_path, dns):
    """A query forwarded while the upstream is down comes back as ECONNREFUSED (an ICMP
    port unreachable) on the forwarder's connected socket; its reader thread took that for
    shutdown and ended, so no forwarded query was answered again, upstream back or not."""
    import socket as _socket
    import time

    with _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    (state_dir / "provisiond.yaml").write_text(f"dns:\n  upstream: '127.0.0.1:{port}'\n")
    server = start(load_config(state_dir))
    upstream = None
    try:
        with _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM) as client:
            client.sendto(DNSRecord.question("n2.other").pack(), server.sock.getsockname())
        upstream = start_upstream(tmp_path / "up", open_udp("127.0.0.1", port))
        answer, deadline = None, time.monotonic() + 10
        while answer is None and time.monotonic() < deadline:
            query = DNSRecord.question("n2.other")
            host, server_port = server.sock.getsockname()
            try:
                answer = DNSRecord.parse(query.send(host, server_port, timeout=0.5))
            except _socket.timeout:
                pass
        assert answer is not None, "the forwarder stopped relaying replies"
        assert str(answer.rr[0].rdata) == ip_of(2, "10.77")
    finally:
        server.close()
        if upstream:
            upstream.close()


def test_queries_and_replies_are_counted(state_dir, tmp_path, live_metrics):
    upstream = start_upstream(tmp_path / "up", open_udp("127.0.0.1", 0))
    host, port = upstream.sock.getsockname()
    (state_dir / "provisiond.yaml").write_text(f"dns:\n  upstream: '{host}:{port}'\n")
    config = load_config(state_dir)
    add_nodes(config, 2)
    server = start(config)
    try:
        ask(server, "n1.cluster")  # precomputed
        ask(server, "n1.cluster", "MX")  # in the zone, no such record: dnslib, NOERROR
        ask(server, "zz.cluster")  # NXDOMAIN
        ask(server, "n2.other")  # forwarded
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk:
            junk.sendto(b"\x00" * 40, server.sock.getsockname())
            wait_until(lambda: server.counts["dns_queries", "dropped"], 10, "the junk taken")
    finally:
        server.close()
        upstream.close()
    seen = live_metrics()
    # The upstream is a DnsServer of this process too: it answered the forwarded query.
    assert by_label(seen, "provisiond_dns_queries_total", "handling") == {
        "answered": 4, "forwarded": 1, "dropped": 1}
    assert by_label(seen, "provisiond_dns_replies_total", "rcode") == {"noerror": 3,
                                                                       "nxdomain": 1}
