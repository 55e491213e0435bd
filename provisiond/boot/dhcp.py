"""provisiond's DHCP server: reserved addresses and boot files for known MACs only.

One UDP loop answers from precomputed parts (`dhcp_reply.Answers`); phases and discovery
go through `events`; leases are kept in a dict and written at most every few seconds, and
read back at start: a restart must not offer a new machine the pool address a waiting one
still holds.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path

from provisiond.atomic import write_atomic
from provisiond.boot import dhcp_packet as p
from provisiond.boot.dhcp_reply import Answers, client_kind
from provisiond.boot.discovery import DiscoveryLog, DiscoveryPool, enlisting, hold_waiting
from provisiond.boot.phases import PhaseProcess, PhaseRecorder
from provisiond.boot.table import BootTable
from provisiond.boot.udp import UdpServer, open_udp
from provisiond.config import Config
from provisiond.errors import ProvisiondError
from provisiond.state.layout import Layout
from provisiond.state.models import Lease, Leases, parse
from provisiond.states import NodePhase

log = logging.getLogger("provisiond.boot")
CLIENT_PORT, SERVER_PORT = 68, 67


PROXY_PORT = 4011
REQUEST_NAMES = {p.DISCOVER: "discover", p.REQUEST: "request", p.DECLINE: "decline",
                 p.RELEASE: "release", p.INFORM: "inform"}  # anything else counts as "other"


class DhcpServer(UdpServer):
    name = protocol = "dhcp"

    def __init__(self, config: Config, table: BootTable,
                 phases: PhaseRecorder | PhaseProcess | None = None,
                 sock: socket.socket | None = None):
        dhcp = config.dhcp
        super().__init__(sock or open_udp(dhcp.bind, dhcp.port, dhcp.interface, broadcast=True))
        self.config = config
        self.answers = Answers(config, table)
        self.phases = phases or PhaseRecorder(config)
        self.discovery = DiscoveryLog(config)
        self.pool = DiscoveryPool(config) if enlisting(config) else None
        self.reserved = table.by_ip
        self.client_port, self.relay_port = CLIENT_PORT, SERVER_PORT
        self.answer_peer = False  # the proxyDHCP port answers where the request came from
        self._peer: tuple = ("255.255.255.255", CLIENT_PORT)
        self.leases: dict[str, tuple[str, float]] = {}
        self._dirty = False
        self._saved = 0.0
        if not dhcp.proxy:  # a proxyDHCP leases nothing
            self._load_leases()

    @classmethod
    def proxy_port(cls, config: Config, table: BootTable, phases) -> "DhcpServer":
        """proxyDHCP's second port: PXE clients unicast their request for boot data there."""
        dhcp = config.dhcp
        server = cls(config, table, phases, sock=open_udp(dhcp.bind, PROXY_PORT, dhcp.interface,
                                                          broadcast=True))
        server.name, server.answer_peer = "proxydhcp", True
        return server

    def update_table(self, table: BootTable) -> None:
        """Swap in the answers for a rebuilt table (one attribute store: loop-safe)."""
        self.answers = Answers(self.config, table)
        self.reserved = table.by_ip

    def handle(self, data: bytes, peer: tuple) -> None:
        request = p.decode(data)
        self._peer = peer
        answers = self.answers
        kind = request.msg_type
        self.counts["dhcp_requests", REQUEST_NAMES.get(kind, "other")] += 1
        if request.mac not in answers.entries:
            self.counts["dhcp_ignored", "unknown_client"] += 1
            self._unknown(request)
            return
        if kind == p.DISCOVER:
            self._send(request, answers.reply(request, p.OFFER), "offer")
        elif kind == p.REQUEST:
            self._request(request, answers)
        elif kind in (p.RELEASE, p.DECLINE):
            self._dirty = self.leases.pop(request.mac, None) is not None or self._dirty

    def _request(self, request: p.Request, answers: Answers) -> None:
        server_id = request.options.get(p.OPT_SERVER_ID)
        if server_id and server_id != socket.inet_aton(self.config.server.address):
            self.counts["dhcp_ignored", "other_server"] += 1
            return  # the client chose another server
        entry = answers.entries[request.mac]
        wanted = request.options.get(p.OPT_REQUESTED_IP)
        asked = socket.inet_ntoa(wanted) if wanted and len(wanted) == 4 else request.ciaddr
        if not answers.proxy and asked not in ("0.0.0.0", entry.ipaddr):
            self._nak(request, answers)
            return
        if not answers.proxy:  # in proxy mode the address is another server's lease
            self._lease(request.mac, entry.ipaddr)
        self._send(request, answers.reply(request, p.ACK), "ack")
        self._acked(request, entry)

    def _lease(self, mac: str, ipaddr: str) -> None:
        self.leases[mac] = (ipaddr, time.time() + self.config.dhcp.lease_seconds)
        if self.pool is not None:
            self.pool.release(mac)  # approved: it gave its pool address up for its own
        self._dirty = True

    def _nak(self, request: p.Request, answers: Answers) -> None:
        """RFC 2131 4.1, 4.3.2: a NAK has ciaddr 0, so it is broadcast, or relayed with the
        broadcast bit set; never unicast to the address the client wrongly holds."""
        relayed = request.giaddr != "0.0.0.0"
        nak = replace(request, ciaddr="0.0.0.0", flags=request.flags | (0x8000 if relayed else 0))
        self._send(nak, answers.nak(nak), "nak")

    def _acked(self, request: p.Request, entry) -> None:
        kind = client_kind(request.options).value
        if self.phases.record(entry.node, NodePhase.DHCP, f"{kind} {entry.ipaddr}"):
            # One line per boot step: repeats within the recorder's quiet time are not one.
            log.info("%s dhcp ack %s %s (%s)", entry.node, entry.ipaddr, request.mac, kind)

    def _unknown(self, request: p.Request) -> None:
        """Unknown MACs get no answer; with `dhcp.discovery` on they are recorded, and with
        a discovery pool they lease from it (they boot the discovery image)."""
        if not self.config.dhcp.discovery or request.msg_type not in (p.DISCOVER, p.REQUEST):
            return
        arch = request.options.get(p.OPT_ARCH, b"")
        self.discovery.note(
            request.mac, arch=struct.unpack("!H", arch[:2])[0] if len(arch) >= 2 else None,
            vendor_class=request.options.get(p.OPT_VENDOR_CLASS, b"").decode("latin-1"),
            relay=request.giaddr)
        if self.pool is not None and not self.answers.proxy:
            self._pool_lease(request)

    def _pool_lease(self, request: p.Request) -> None:
        """DISCOVER: offer the MAC's pool address; REQUEST: ACK the address it holds, NAK
        another one asked of this server."""
        answers = self.answers
        if request.msg_type == p.DISCOVER:
            address = self.pool.offer(request.mac, self.reserved)
            if address is None:
                self.counts["dhcp_ignored", "pool_full"] += 1
                return
            self._send(request, answers.pool_reply(request, p.OFFER, address), "offer")
            return
        server_id = request.options.get(p.OPT_SERVER_ID)
        if server_id and server_id != socket.inet_aton(self.config.server.address):
            self.pool.release(request.mac)  # it took another server's offer
            return
        wanted = request.options.get(p.OPT_REQUESTED_IP)
        asked = socket.inet_ntoa(wanted) if wanted and len(wanted) == 4 else request.ciaddr
        if asked in self.reserved or not self.pool.holds(request.mac, asked):
            self._nak(request, answers)
            return
        self.pool.offer(request.mac, self.reserved)  # renews it
        self._dirty = True
        self._send(request, answers.pool_reply(request, p.ACK, asked), "ack")

    def _send(self, request: p.Request, reply: bytes, kind: str) -> None:
        """Send `reply` (an offer, ack or nak: `kind`) where the request says."""
        if self.answer_peer:
            self.sock.sendto(reply, self._peer)
        elif request.giaddr != "0.0.0.0":
            self.sock.sendto(reply, (request.giaddr, self.relay_port))
        elif request.ciaddr != "0.0.0.0":
            self.sock.sendto(reply, (request.ciaddr, self.client_port))
        else:
            self.sock.sendto(reply, ("255.255.255.255", self.client_port))
        self.counts["dhcp_replies", kind] += 1

    def tick(self) -> None:
        if self._dirty and time.monotonic() - self._saved > 5:
            self.save_leases()

    def save_leases(self) -> None:
        """Write the unexpired leases, the nodes' and the pool's, atomically (at most every
        5 s, and on close); a write that fails leaves them dirty, so the next tick or
        close() tries again."""
        self._saved = time.monotonic()
        now = time.time()
        self.leases = {mac: lease for mac, lease in self.leases.items() if lease[1] > now}
        # a MAC in the pool now (a deleted node enlisting again) keeps its pool lease, not
        # the node address it held before
        held = {**self.leases, **(self.pool.current(now) if self.pool is not None else {})}
        data = Leases({mac: Lease(ip=ip, expires=round(exp)) for mac, (ip, exp) in held.items()})
        write_atomic(Layout.of(self.config).leases, data.text())
        self._dirty = False

    def _load_leases(self) -> None:
        """The unexpired leases the last run saved: a pool address's to the pool (while it
        runs no other machine gets that address), a node's to `leases`. A file that cannot
        be read is one error line. Then the pool also holds the addresses of the machines the
        discovery book has waiting that no saved lease names (hold_waiting): all of them on
        a first start, after a damaged file, or from a release that saved none."""
        path, now = Layout.of(self.config).leases, time.time()
        try:
            saved = parse(Leases, Path(path).read_bytes(), path).root
        except FileNotFoundError:
            saved = None
        except (OSError, ProvisiondError) as exc:
            log.error("dhcp: leases not read back, starting without them: %s", exc)
            saved = None
        for mac, lease in (saved or {}).items():
            if lease.expires <= now:
                continue
            if self.pool is not None and lease.ip in self.pool:
                self.pool.restore(mac, lease.ip, lease.expires, now)
            else:
                self.leases[mac] = (lease.ip, float(lease.expires))
        if self.pool is not None:  # a file of a release that saved no pool lease too
            hold_waiting(self.config, self.pool, now)

    def close(self) -> None:
        """Stop, and save the leases a last time; a write that fails then is one error line
        (the other servers still stop), not a traceback."""
        super().close()
        if self._dirty and self._thread is not None and self._thread.is_alive():
            log.error("dhcp: leases not saved at stop: a request still being handled")
        elif self._dirty:
            try:
                self.save_leases()
            except OSError as exc:
                log.error("dhcp: leases not saved at stop: %s", exc)
