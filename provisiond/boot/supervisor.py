"""`provisiond serve`: the enabled boot servers in one process, gunicorn as a child (two
with the API on a listener of its own: the boot network's and the API's).

DHCP, DNS and TFTP each run one loop in their own thread; the main thread follows the
inventory on the store (its watch) and swaps rebuilt tables in. SIGTERM stops everything cleanly.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from provisiond.boot.logs import FORMAT_ENV, LEVEL_ENV, flush_logs
from provisiond.boot.phases import PHASE_FD_ENV, PhaseProcess
from provisiond.boot.table import TableWatcher
from provisiond.config import Config, check_serving, url_host
from provisiond.errors import ProvisiondError, ServeFailed
from provisiond.metrics import MetricsRun, start_run

log = logging.getLogger("provisiond.boot")
T = TypeVar("T")
_HTTP_NAMES = {"all": "http", "boot": "http", "api": "api"}  # as logs and errors name them
SERVICES = ("http", "dhcp", "tftp", "dns")
WATCH_SECONDS = 1.0  # the longest a watch of the inventory waits: then gunicorn is looked at
LISTENER_ENV = "PROVISIOND_LISTENER"  # which routes a gunicorn answers (api/listeners.py)
CLIENT_TIMEOUT_ENV = "PROVISIOND_CLIENT_TIMEOUT"  # http.client_timeout (api/worker.py)


def gunicorn_command(config: Config, listener: str = "all") -> list[str]:
    """gunicorn for one HTTP listener: "all" or "boot" on http.bind, "api" on api.bind (with
    TLS when a certificate is set)."""
    bind, port, workers = _listener_address(config, listener)
    # One greenlet per connection (provisiond.api.worker): idle and slow clients hold no
    # thread; a request's headers must arrive within the keepalive timeout.
    command = [sys.executable, "-m", "gunicorn", "--bind", f"{url_host(bind)}:{port}",
               "--workers", str(workers), "--worker-class", "provisiond.api.worker.BootWorker",
               "--worker-connections", str(config.http.connections), "--keep-alive", "5",
               "--graceful-timeout", "5",
               "--no-control-socket",  # else every instance shares ~/.gunicorn/gunicorn.ctl
               "--config", "python:provisiond.api.gunicorn_conf"]
    if listener == "api" and config.api.tls_cert:
        command += ["--certfile", config.api.tls_cert, "--keyfile", config.api.tls_key]
    return [*command, "provisiond.api:create_app_from_env()"]


def enabled_services(config: Config, overrides: dict[str, bool | None] | None = None
                     ) -> dict[str, bool]:
    """What serve runs: each service's `enabled` setting, the API's own listener when
    api.bind is set, then `overrides` (serve's --X/--no-X flags; None keeps the setting)."""
    enabled = {name: getattr(config, name).enabled for name in SERVICES}
    enabled["api"] = config.api.bind is not None
    enabled.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return enabled


def service_sockets(config: Config, enabled: dict[str, bool]) -> list[tuple[str, str, str, int]]:
    """(service, tcp|udp, bind, port) of every socket serve opens (doctor probes them)."""
    from provisiond.boot.dhcp import PROXY_PORT

    found = [(_HTTP_NAMES[listener], "tcp", *_listener_address(config, listener)[:2])
             for listener in http_listeners(config, enabled)]
    dhcp = config.dhcp
    if enabled["dhcp"]:
        found += [("dhcp", "udp", dhcp.bind, dhcp.port)]
        found += [("dhcp", "udp", dhcp.bind, PROXY_PORT)] if dhcp.proxy else []
    return found + [(name, "udp", getattr(config, name).bind, getattr(config, name).port)
                    for name in ("tftp", "dns") if enabled[name]]


def http_listeners(config: Config, enabled: dict[str, bool]) -> list[str]:
    """The HTTP listeners to run: one for every route ("all"), or, with api.bind set, the
    boot network's ("boot") and the API's ("api") apart."""
    apart = config.api.bind is not None
    listeners = ["boot" if apart else "all"] if enabled["http"] else []
    return listeners + (["api"] if apart and enabled.get("api", True) else [])


def _listener_address(config: Config, listener: str) -> tuple[str, int, int]:
    if listener == "api":
        return config.api.bind, config.api.port, config.api.workers
    return config.http.bind, config.http.port, config.http.workers


class Supervisor:
    """Starts the enabled services, reloads their tables, stops them on request."""

    def __init__(self, config: Config, enabled: dict[str, bool]):
        self.config = config
        self.enabled = enabled
        self.stopping = threading.Event()
        self.udp: list = []
        self.tftp = None
        self.listeners = http_listeners(config, enabled)
        self.gunicorns: dict[str, subprocess.Popen] = {}
        self.watcher = TableWatcher(config)
        self.phases: PhaseProcess | None = None
        self.metrics: MetricsRun | None = None

    def start(self) -> None:
        for listener in self.listeners:
            bind, port, _ = _listener_address(self.config, listener)
            _opening(_HTTP_NAMES[listener], bind, port, lambda: _probe_tcp(bind, port))
        self.metrics = start_run(self.config)  # before any child: they inherit its directory
        if self.enabled["dhcp"] or self.listeners:
            self.phases = PhaseProcess(self.config)
        try:
            self._start_udp()
            if self.enabled["tftp"]:
                self._start_tftp()
        except OSError as exc:
            self.stop()
            raise ServeFailed(f"cannot start the boot services: {exc.strerror or exc}") from None
        except ProvisiondError:  # a port in use, a bad setting: stop what started
            self.stop()
            raise
        for listener in self.listeners:
            self._start_http(listener)
        log.info("serving %s", ", ".join(name for name, on in self.enabled.items() if on))

    def _start_udp(self) -> None:
        from provisiond.boot.dhcp import PROXY_PORT, DhcpServer
        from provisiond.boot.dns import DnsServer

        config, table = self.config, self.watcher.table
        dhcp, dns = config.dhcp, config.dns
        if self.enabled["dhcp"]:
            self.udp.append(_opening("dhcp", dhcp.bind, dhcp.port,
                                     lambda: DhcpServer(config, table, self.phases)))
            if dhcp.proxy:
                self.udp.append(_opening("proxydhcp", dhcp.bind, PROXY_PORT, lambda: (
                    DhcpServer.proxy_port(config, table, self.phases))))
        if self.enabled["dns"]:
            self.udp.append(_opening("dns", dns.bind, dns.port,
                                     lambda: DnsServer(config, table)))
        for server in self.udp:
            server.start()
            log.info("%s listening on %s:%s", server.name, *server.address[:2])

    def _start_tftp(self) -> None:
        from provisiond.boot.tftp import make_tftp_server

        self.tftp = make_tftp_server(self.config, self._node_for)
        tftp = self.config.tftp
        _opening("tftp", tftp.bind, tftp.port, lambda: self.tftp.bind(tftp.bind, tftp.port))
        threading.Thread(target=self.tftp.listen, name="tftp", daemon=True).start()
        log.info("tftp listening on %s:%s serving %s", tftp.bind, tftp.port, tftp.root)

    def _start_http(self, listener: str) -> None:
        config = self.config
        env = dict(os.environ, PROVISIOND_STATE_DIR=str(config.state_dir),
                   **{PHASE_FD_ENV: str(self.phases.fd), LISTENER_ENV: listener,
                      LEVEL_ENV: config.log.level, FORMAT_ENV: config.log.format,
                      CLIENT_TIMEOUT_ENV: repr(config.http.client_timeout)})
        self.gunicorns[listener] = subprocess.Popen(gunicorn_command(config, listener), env=env,
                                                    pass_fds=(self.phases.fd,))
        bind, port, _ = _listener_address(config, listener)
        scheme = "https" if listener == "api" and config.api.tls_cert else "http"
        log.info("%s (gunicorn pid %d) on %s://%s:%s", _HTTP_NAMES[listener],
                 self.gunicorns[listener].pid, scheme, url_host(bind), port)

    def _node_for(self, address: str) -> str | None:
        entry = self.watcher.table.by_ip.get(address)
        return entry.node if entry else None

    def run(self) -> int:
        """Reload tables when the inventory changes (the store's watch) until stopped; the
        exit code (the caller stops the services). Gunicorn is looked at between watches."""
        while not self.stopping.is_set():
            for listener, gunicorn in self.gunicorns.items():
                if gunicorn.poll() is not None:
                    log.error("%s: gunicorn exited with %s; stopping", _HTTP_NAMES[listener],
                              gunicorn.returncode)
                    return 1
            if self.watcher.wait_changed(timeout=WATCH_SECONDS) and not self.stopping.is_set():
                self._update_tables()
        return 0

    def _update_tables(self) -> None:
        """Hand each UDP server the new table; one that cannot use it keeps its last one."""
        for server in self.udp:
            try:
                server.update_table(self.watcher.table)
            except Exception as exc:  # defence in depth: builders skip bad records already,
                log.error("%s: table not updated, keeping the previous one: %s: %s",  # a bug
                          server.name, type(exc).__name__, exc, exc_info=exc)
        log.info("inventory changed: %d reservations", len(self.watcher.table.by_mac))

    def stop(self, *_args) -> None:
        """Stop every service (also a signal handler); gunicorn gets SIGTERM, then SIGKILL."""
        self.stopping.set()
        for server in self.udp:
            server.stop()  # all loops end together; close() then waits for each
        for server in self.udp:
            server.close()
        if self.tftp:
            self.tftp.stop(now=True)  # also before its loop began: it then ends at once
        running = [g for g in self.gunicorns.values() if g.poll() is None]
        for gunicorn in running:
            gunicorn.terminate()
        for gunicorn in running:
            try:
                gunicorn.wait(10)
            except subprocess.TimeoutExpired:
                gunicorn.kill()
                gunicorn.wait()
        if self.phases:
            self.phases.close()
        if self.metrics:
            self.metrics.close()


def _opening(service: str, bind: str, port: int, open_socket: Callable[[], T]) -> T:
    """open_socket(); an OSError (a port in use, a missing interface) as one ServeFailed
    line naming the service and its address (it said only "Address already in use")."""
    try:
        return open_socket()
    except OSError as exc:
        raise ServeFailed(f"cannot start {service} on {url_host(bind)}:{port}: "
                          f"{exc.strerror or exc}") from None


def _probe_tcp(bind: str, port: int) -> None:
    """Bind (as gunicorn does, SO_REUSEADDR) and close: a port in use is found before
    anything starts, not by gunicorn after DHCP, DNS and TFTP are up."""
    with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((bind, port))


def serve(config: Config, enabled: dict[str, bool]) -> int:
    """Run the services until SIGTERM or SIGINT; returns the exit code."""
    check_serving(config, enabled)
    supervisor = Supervisor(config, enabled)
    # Before anything starts: a signal during start then ends run() at once, and the
    # children started so far are stopped rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stopping.set())
    try:
        supervisor.start()
    finally:
        flush_logs()
    try:
        code = supervisor.run()
    finally:
        supervisor.stop()
        log.info("stopped")
        flush_logs()
    return code
