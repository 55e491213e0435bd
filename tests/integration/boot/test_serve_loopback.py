"""`provisiond serve` with HTTP, TFTP and DNS on loopback, exercised with real clients:
curl (HTTP, TFTP), tftp-hpa's client, dig."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bootdata import add_blob, add_image, add_nodes, ip_of, mac_of
from provisiond.config import load_config, write_default_config
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import NetDev, Record
from provisiond.status import read_status
from servers import (REPO, free_port, loopback_services, session_alive, start_serve, stop_serve,
                     wait_http, write_config)
from tests.tools import command

IPXE_ROOT = "/usr/lib/ipxe"
LO1 = "127.0.0.2"  # node lo1: a loopback address that is not the server's own

CLIENT_TIMEOUT = 10  # http.client_timeout here (default 30)

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = tmp_path_factory.mktemp("serve") / "state"
    ports = loopback_services(state)
    write_config(state, http={"client_timeout": CLIENT_TIMEOUT})
    config = load_config(state)
    add_nodes(config, 20)
    with InventoryStore(config).edit() as inv:  # a node on loopback, beside the server's
        inv.nodes["lo1"] = Record(image="tiny", netdevs={"eth0": NetDev(
            mac="02:00:00:00:00:01", ipaddr=LO1)})
    add_image(config, "tiny")
    proc = start_serve(state)
    base = f"http://127.0.0.1:{ports['http']}"
    try:
        wait_http(f"{base}/boot/ipxe", proc)
        yield config, ports, base, proc
    finally:
        stop_serve(proc)


def run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(command(list(cmd)), capture_output=True, timeout=timeout)


def test_curl_tftp_fetches_undionly_byte_identical(served, tmp_path):
    _, ports, _, _ = served
    out = tmp_path / "undionly.kpxe"
    result = run("curl", "-sS", "--tftp-blksize", "1468", "-o", str(out),
                 f"tftp://127.0.0.1:{ports['tftp']}/undionly.kpxe")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == open(f"{IPXE_ROOT}/undionly.kpxe", "rb").read()


def test_tftp_hpa_client_with_tsize(served, tmp_path):
    _, ports, _, _ = served
    result = run("tftp", "-v", "-m", "binary", "127.0.0.1", str(ports["tftp"]), "-c", "get",
                 "snponly.efi", str(tmp_path / "snp"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "snp").read_bytes() == open(f"{IPXE_ROOT}/snponly.efi", "rb").read()


def rrq(port: int, name: bytes, options: bytes = b"") -> bytes:
    """Send a raw read request and return the first answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(b"\0\1" + name + b"\0octet\0" + options, ("127.0.0.1", port))
        return sock.recvfrom(2000)[0]


@pytest.mark.parametrize("name", [b"../../etc/passwd", b"/etc/passwd", b"qemu/../../../etc/passwd",
                                  b"/usr/lib/ipxe/undionly.kpxe"])
def test_tftp_refuses_escapes_and_absolute_paths(served, name):
    _, ports, _, _ = served
    answer = rrq(ports["tftp"], name)
    assert answer[:2] == b"\0\5", answer  # ERROR
    assert answer[2:4] == b"\0\2"  # access violation


def test_tftp_answers_missing_files_and_directories_with_not_found(served):
    _, ports, _, _ = served
    assert rrq(ports["tftp"], b"nothing-here.efi")[:4] == b"\0\5\0\1"
    assert rrq(ports["tftp"], b"qemu")[:4] == b"\0\5\0\1"


def test_tftp_refuses_writes(served):
    _, ports, _, _ = served
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(b"\0\2evil.bin\0octet\0", ("127.0.0.1", ports["tftp"]))
        assert sock.recvfrom(100)[0][:4] == b"\0\5\0\2"
    assert not os.path.exists(f"{IPXE_ROOT}/evil.bin")


def dig(port: int, *query: str) -> list[str]:
    result = run("dig", "+short", "+time=2", "+tries=1", "-p", str(port), "@127.0.0.1", *query)
    return result.stdout.decode().split()


def test_dig_resolves_names_and_reverse(served):
    _, ports, _, _ = served
    assert dig(ports["dns"], "n3") == [ip_of(3)]
    assert dig(ports["dns"], "n3.cluster", "A") == [ip_of(3)]
    assert dig(ports["dns"], "N3.Cluster", "AAAA") == ["fd00::3"]
    assert dig(ports["dns"], "-x", ip_of(3)) == ["n3.cluster."]
    assert dig(ports["dns"], "-x", "fd00::3") == ["n3.cluster."]
    assert dig(ports["dns"], "cluster", "SOA")[0] == "provisiond.cluster."
    full = run("dig", "+time=2", "+tries=1", "-p", str(ports["dns"]), "@127.0.0.1",
               "nobody.cluster")
    assert b"status: NXDOMAIN" in full.stdout


def test_ipxe_script_for_known_mac(served):
    config, _, base, _ = served
    text = run("curl", "-sS", f"{base}/boot/ipxe/{mac_of(4)}").stdout.decode()
    manifest_kernel = (config.images_dir / "tiny" / "manifest.json").read_text()
    assert "provisiond.node=n4" in text and "initrd --name l2" in text
    kernel_line = next(line for line in text.splitlines() if line.startswith("kernel "))
    assert kernel_line.split()[1].rsplit("/", 1)[1] in manifest_kernel
    assert wait_status(config, "n4", "ipxe")["phase"] == "ipxe"


def wait_status(config, node: str, phase: str, timeout: float = 10) -> dict | None:
    deadline = time.monotonic() + timeout  # written by serve's phase writer process
    while time.monotonic() < deadline:
        status = read_status(config, node)
        if status and status["phase"] == phase:
            return status
        time.sleep(0.1)
    return read_status(config, node)


def test_kernel_fetch_by_a_node_is_a_logged_boot_step(served):
    config, _, base, _ = served
    manifest = json.loads((config.images_dir / "tiny" / "manifest.json").read_text())
    kernel = manifest["kernel"]["digest"][7:]
    assert run("curl", "-sSf", "--interface", LO1, "-o", "/dev/null",
               f"{base}/blobs/sha256/{kernel}").returncode == 0
    assert wait_status(config, "lo1", "kernel")["phase"] == "kernel"
    log = config.state_dir / "serve.log"
    deadline = time.monotonic() + 5  # the log is flushed once a second
    while " lo1 kernel 200 " not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    line = next(x for x in log.read_text().splitlines() if " lo1 kernel 200 " in x)
    assert f" {len(b'kernel-tiny')} bytes " in line


def test_blob_download_resumes_with_curl_c(served, tmp_path):
    config, _, base, _ = served
    data = os.urandom(3 << 20)
    digest = add_blob(config, data)[7:]
    out = tmp_path / "blob"
    out.write_bytes(data[:1234567])
    result = run("curl", "-sS", "-C", "-", "-o", str(out), f"{base}/blobs/sha256/{digest}")
    assert result.returncode == 0, result.stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest


def test_junk_http_requests_get_4xx_json(served):
    _, ports, base, _ = served
    for path in ["/page/nothing.js", "/boot/ipxe/zz", "/blobs/sha256/xyz", "/overlays/../x", "/%00",
                 "/boot/files/..%2f..%2fetc%2fpasswd", "/api/v1/status/n1"]:
        result = run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{base}{path}")
        assert result.stdout.decode()[0] == "4", path
    for junk, status in [(b"\x16\x03\x01junk that is not HTTP\r\n\r\n", 400),
                         (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414),
                         (b"GET / HTTP/1.1\r\nX: " + b"b" * 9000 + b"\r\n\r\n", 431)]:
        with socket.create_connection(("127.0.0.1", ports["http"]), timeout=5) as sock:
            sock.sendall(junk)
            answer = read_until_closed(sock)  # an answer, not a dropped connection
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status), answer
        assert b"Connection: close" in head and b"Content-Type: application/json" in head
        # gunicorn's own errors too
        assert set(json.loads(body)["error"]) == {"code", "message", "field"}
    assert run("curl", "-sS", f"{base}/boot/ipxe").returncode == 0


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's timeout bounds each wait)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_idle_and_half_sent_requests_do_not_hold_boot_requests(served):
    """500 connections, half idle and half stopped mid-header (what held every gthread
    thread), do not stop a node's script; the server closes a half request by itself."""
    _, ports, base, _ = served
    held = []
    try:
        for i in range(500):
            sock = socket.create_connection(("127.0.0.1", ports["http"]), timeout=60)
            if i % 2:
                sock.sendall(b"GET /boot/ipxe HTTP/1.1\r\nHost: x\r\n")  # headers never end
            held.append(sock)
        with urllib.request.urlopen(f"{base}/boot/ipxe/{mac_of(5)}", timeout=10) as answer:
            assert b"provisiond.node=n5 " in answer.read()
        for sock in held[1:8:2]:
            assert read_until_closed(sock) == b""  # closed without an answer, well within 60 s
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow  # CLIENT_TIMEOUT s: http.client_timeout
def test_a_client_stalled_in_its_body_is_disconnected(served):
    _, ports, _, _ = served
    with socket.create_connection(("127.0.0.1", ports["http"]), timeout=90) as sock:
        sock.sendall(b"POST /api/v1/credentials/n1 HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 100\r\n"
                     b"Content-Type: application/json\r\n\r\n{")  # 99 bytes never come
        started = time.monotonic()
        answer = read_until_closed(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]  # werkzeug: ClientDisconnected
    assert CLIENT_TIMEOUT - 1 < waited < CLIENT_TIMEOUT + 15, waited  # the setting, not 30 s


def test_inventory_change_reaches_dns(served):
    config, ports, _, _ = served
    add_nodes(config, 25)
    deadline = time.monotonic() + 15
    while dig(ports["dns"], "n25") != [ip_of(25)] and time.monotonic() < deadline:
        time.sleep(0.3)
    assert dig(ports["dns"], "n25") == [ip_of(25)]


def serving_one_worker(state: Path) -> subprocess.Popen:
    """`serve` on a state dir of its own, HTTP on a free loopback port with one worker (it
    answers once its signal handlers are in: a worker still booting when a signal comes
    misses it, and gunicorn kills it after graceful_timeout), once it answers."""
    write_default_config(state)
    port = free_port()
    write_config(state, http={"bind": "127.0.0.1", "port": port, "workers": 1})
    proc = start_serve(state)
    wait_http(f"http://127.0.0.1:{port}/boot/ipxe", proc)
    return proc


def stopped_with_its_session(proc: subprocess.Popen) -> bool:
    """stop_serve gave 0 and the whole session is gone (waited for, bounded: gunicorn's
    last children may be reaped still)."""
    stopped = stop_serve(proc) == 0
    deadline = time.monotonic() + 10
    while session_alive(proc) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stopped and not session_alive(proc)


def test_sigterm_stops_everything(tmp_path):
    proc = serving_one_worker(tmp_path / "state")
    assert stopped_with_its_session(proc)


def test_ctrl_c_stops_serve_without_an_error_line(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: every gunicorn
    worker logged 'ERROR ... greenlet ... failed: 0' and a traceback (its quit handler's
    sys.exit(0), met by gevent during the worker's shutdown)."""
    import signal

    state = tmp_path / "state"
    proc = serving_one_worker(state)
    os.killpg(proc.pid, signal.SIGINT)
    assert stopped_with_its_session(proc)
    log = (state / "serve.log").read_text()
    assert " ERROR " not in log and "Traceback" not in log, log


def junk_packets(seed: int, count: int, valid: bytes):
    """Random datagrams, half of them corrupted copies of a valid request."""
    import random

    rng = random.Random(seed)
    for i in range(count):
        if i % 2:
            yield bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
        else:
            data = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
            yield bytes(data[:rng.randint(1, len(data))])


def test_random_junk_does_not_stop_dns_or_tftp(served, tmp_path):
    _, ports, _, proc = served
    from dnslib import DNSRecord

    dns_valid = bytes(DNSRecord.question("n2.cluster", "A").pack())
    tftp_valid = b"\0\1undionly.kpxe\0octet\0blksize\x001468\0tsize\x000\0"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for port, valid in ((ports["dns"], dns_valid), (ports["tftp"], tftp_valid)):
            for packet in junk_packets(42, 2000, valid):
                sock.sendto(packet, ("127.0.0.1", port))
    assert proc.poll() is None
    assert dig(ports["dns"], "n2.cluster") == [ip_of(2)]
    test_curl_tftp_fetches_undionly_byte_identical(served, tmp_path)


@pytest.mark.slow
def test_fifty_concurrent_downloads_of_a_100mb_layer(served, tmp_path):
    config, _, base, _ = served
    from concurrent.futures import ThreadPoolExecutor

    data = os.urandom(1 << 20) * 100
    digest = add_blob(config, data)[7:]
    del data
    pipeline = f"curl -sS --max-time 240 {base}/blobs/sha256/{digest} | sha256sum"

    def fetch(_):
        return subprocess.run(pipeline, shell=True, capture_output=True, timeout=300).stdout

    with ThreadPoolExecutor(50) as pool:
        sums = list(pool.map(fetch, range(50)))
    assert [s.split()[0].decode() for s in sums] == [digest] * 50


def test_port_in_use_is_one_line_error(tmp_path):
    state = tmp_path / "state"
    write_default_config(state)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        write_config(state, dns={"enabled": True, "bind": "127.0.0.1",
                                 "port": busy.getsockname()[1]})
        result = subprocess.run([sys.executable, "-m", "provisiond", "--state-dir", str(state),
                                 "serve", "--no-http"], capture_output=True, text=True,
                                timeout=60, cwd=REPO)
    assert result.returncode == 8
    assert result.stderr.strip().count("\n") == 0 and "Address already in use" in result.stderr
