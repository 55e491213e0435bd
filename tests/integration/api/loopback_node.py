"""A node played from loopback against a real `provisiond serve`: the requests its boot
makes, sent from its own reserved address (one in 127.0.0.0/8), so the server records its
phases as it records a real node's: dhcp from the DHCP exchange, ipxe from its script's
request, kernel from its kernel's download; booted, ready... from its agent's reports, with
the credential its script's token is exchanged for (trust.privileged_port off: the test
cannot promise a port below 1024 is free).
"""

from __future__ import annotations

import http.client
import socket
import urllib.parse

from bootdata import TOKEN_RE, add_image, add_nodes, ip_of, mac_of, relayed
from provisiond.boot import dhcp_packet as p
from provisiond.config import Config, load_config
from provisiond.status import read_status
from servers import free_port, loopback_services, write_config
from tests.waits import wait_until

RECORDED = 15  # seconds for the phase writer to record a phase the server saw
NET = "127.0"  # node n<i> at 127.0.0.<i + 2>: loopback, not the server's own address


class LoopbackNode:
    def __init__(self, config: Config, http_port: int, name: str, mac: str, address: str,
                 dhcp_port: int | None = None):
        self.config, self.http_port, self.dhcp_port = config, http_port, dhcp_port
        self.name, self.mac, self.address = name, mac, address
        self.token: str | None = None
        self.credential: str | None = None

    def request(self, method: str, path: str, body: dict | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        """(status, body) of a request sent from the node's address."""
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10,
                                                source_address=(self.address, 0))
        try:
            data = urllib.parse.urlencode(body).encode() if body is not None else None
            sent = dict(headers or {})
            if data is not None:
                sent["Content-Type"] = "application/x-www-form-urlencoded"
            connection.request(method, path, body=data, headers=sent)
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    def dhcp(self) -> None:
        """DISCOVER and REQUEST through a relay at 127.0.0.1: the ACK is the dhcp phase."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for packet in (relayed(self.mac, p.DISCOVER), relayed(self.mac, p.REQUEST, (
                    p.OPT_REQUESTED_IP, socket.inet_aton(self.address)))):
                sock.sendto(packet, ("127.0.0.1", self.dhcp_port))
        self.wait_recorded("dhcp")

    def ipxe(self) -> None:
        """The node's iPXE script (the ipxe phase); keeps the provisioning token in it."""
        status, script = self.request("GET", f"/boot/ipxe/{self.mac}")
        assert status == 200, script
        self.token = TOKEN_RE.search(script.decode()).group(1)
        self.wait_recorded("ipxe")

    def kernel(self, digest: str) -> None:
        """The whole kernel blob (`sha256:...`): the kernel phase."""
        status, _ = self.request("GET", f"/blobs/sha256/{digest.removeprefix('sha256:')}")
        assert status == 200
        self.wait_recorded("kernel")

    def report(self, phase: str, detail: str = "") -> None:
        """What the agent does: POST /api/v1/status/<node> with the node credential (got
        first from the token of a script fetched now, if the node has none yet)."""
        if self.credential is None:
            self.exchange()
        status, body = self.request("POST", f"/api/v1/status/{self.name}",
                                    {"phase": phase, "detail": detail},
                                    {"Authorization": f"Bearer {self.credential}"})
        assert status == 200, body

    def exchange(self) -> None:
        if self.token is None:
            self.ipxe()
        status, body = self.request("POST", f"/api/v1/credentials/{self.name}",
                                    {"token": self.token})
        assert status == 200, body
        self.credential = body.decode().strip()

    def wait_recorded(self, phase: str) -> None:
        """Until the node's status shows `phase` (the phase writer records off the request
        path, so a later report must not overtake it)."""
        wait_until(lambda: (read_status(self.config, self.name) or {}).get("phase") == phase,
                   RECORDED, f"{self.name}'s {phase} phase recorded")


def prepare(state, count: int, **sections) -> tuple[Config, dict, dict, dict]:
    """A new state dir for a loopback serve (HTTP, TFTP, DNS and DHCP on free 127.0.0.1
    ports, `sections` merged into provisiond.yaml) with image tiny and nodes n1..nCOUNT at
    127.0.0.3...: (config, ports, the image's manifest, {name: LoopbackNode})."""
    ports = loopback_services(state)
    ports["dhcp"] = free_port(socket.SOCK_DGRAM)
    write_config(state, dhcp={"enabled": True, "bind": "127.0.0.1", "port": ports["dhcp"]},
                 trust={"privileged_port": False}, **sections)
    config = load_config(state)
    add_nodes(config, count, net=NET)
    manifest = add_image(config, "tiny")
    nodes = {f"n{i}": LoopbackNode(config, ports["http"], f"n{i}", mac_of(i), ip_of(i, NET),
                                   ports["dhcp"]) for i in range(1, count + 1)}
    return config, ports, manifest, nodes
