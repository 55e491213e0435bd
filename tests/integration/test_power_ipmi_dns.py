"""An IPMI BMC named by a host name whose lookups are slow (a resolver that answers late):
pyghmi resolved the name once more when it sent its first packet, holding the session
table's lock that every other session waits on, so one BMC's slow lookup held up every
other BMC's call of the fan-out.

Everything runs in a network namespace and a mount namespace this test creates (its
resolv.conf is bound over /etc/resolv.conf there only): three pyghmi BMCs on loopback, a
nameserver (dnslib) on 127.0.0.1 that answers the first lookup of a name at once and every
later one after DELAY seconds, and `power status`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.boot.netns import in_netns, ip
from tests.integration.test_power_ipmi import PASSWORD, USER, free_udp_ports
from tests.tools import tool

pytestmark = [pytest.mark.netns, pytest.mark.skipif(
    os.geteuid() != 0 or not all(tool(t) for t in ("ip", "unshare", "sh")),
    reason="needs root, iproute2 and unshare")]
BMC_SCRIPT = Path(__file__).resolve().parent / "test_power_ipmi.py"
DELAY = 3  # seconds the nameserver takes to answer a name's second and later lookups
NAMESERVER = """
import socket, threading, time
from dnslib import A, QTYPE, RR, DNSRecord
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("127.0.0.1", 53))
seen = set()
print("ready", flush=True)

def answer(data, peer, delay):
    time.sleep(delay)
    query = DNSRecord.parse(data)
    reply = query.reply()
    if query.q.qtype == QTYPE.A:
        reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A("127.0.0.1"), ttl=0))
    server.sendto(reply.pack(), peer)

while True:
    data, peer = server.recvfrom(4096)
    question = DNSRecord.parse(data).q
    key = (str(question.qname), question.qtype)
    delay = DELAY if key in seen else 0
    seen.add(key)
    threading.Thread(target=answer, args=(data, peer, delay), daemon=True).start()
"""


@pytest.fixture
def namespace(tmp_path):
    name = f"pdns{os.getpid()}"
    ip("netns", "add", name)
    procs = []
    try:
        ip("-n", name, "link", "set", "lo", "up")
        procs.append(subprocess.Popen(in_netns(name, [sys.executable, "-c",
                                                       f"DELAY = {DELAY}\n" + NAMESERVER]),
                                      stdout=subprocess.PIPE, text=True))
        assert procs[0].stdout.readline() == "ready\n"
        ports = free_udp_ports(3)
        for port in ports:
            procs.append(subprocess.Popen(
                in_netns(name, [sys.executable, str(BMC_SCRIPT), str(port)]),
                stdout=subprocess.PIPE, text=True,
                env=dict(os.environ, PYTHONPATH=str(BMC_SCRIPT.parents[2]))))
            assert json.loads(procs[-1].stdout.readline()) == {"ready": port}
        yield name, ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        subprocess.run([tool("ip"), "netns", "del", name], capture_output=True)


def test_a_bmc_whose_name_resolves_slowly_holds_up_no_other(namespace, state_dir, tmp_path):
    name, ports = namespace
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver 127.0.0.1\noptions timeout:{DELAY * 3} attempts:1\n")
    nodes = [("slow1", "bmc-slow.example", ports[0]), ("i1", "127.0.0.1", ports[1]),
             ("i2", "127.0.0.1", ports[2])]
    for node, address, port in nodes:
        added = subprocess.run(
            [sys.executable, "-m", "provisiond", "--state-dir", str(state_dir), "node", "add",
             node, "--bmc-driver", "ipmi", "--bmc-address", address, "--bmc-port", str(port),
             "--bmc-username", USER, "--bmc-password-file", str(secret),
             "--bmc-cipher-suite", "3"], capture_output=True, text=True)
        assert added.returncode == 0, added.stderr
    status = (f"mount --bind {resolv} /etc/resolv.conf && exec {sys.executable} -m "
              f"provisiond --state-dir {state_dir} power status slow1,i[1-2] --json "
              f"--timeout {DELAY * 4}")
    child = subprocess.run(in_netns(name, ["unshare", "--mount", tool("sh"), "-c", status]),
                           capture_output=True, text=True, timeout=120)
    rows = {row["node"]: row for row in json.loads(child.stdout)}
    assert {node: row["detail"] for node, row in rows.items()} == {
        "slow1": "off", "i1": "off", "i2": "off"}, child.stderr
    # the others answer within a second: they waited for slow1's second lookup (3 s)
    assert max(rows["i1"]["seconds"], rows["i2"]["seconds"]) < DELAY - 1, rows
