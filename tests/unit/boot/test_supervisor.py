"""`provisiond serve`'s supervisor in-process: start failures and the way it ends."""

from __future__ import annotations

import signal
import sys

import pytest

from provisiond.boot import supervisor
from provisiond.boot.supervisor import serve

NONE = {"http": False, "dhcp": False, "tftp": False, "dns": False}


def free_tcp_port() -> int:
    """A loopback port free now: serve checks the HTTP port before anything starts, and
    the default 9873 may be in use by another serve on this machine."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def handlers():
    """serve() installs SIGTERM/SIGINT handlers: give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_gunicorn_exit_ends_serve_with_code_1_and_one_stop(config, monkeypatch, handlers):
    """A gunicorn that dies (e.g. its port is taken) ends serve with 1, not an OSError from
    stopping the phase writer twice."""
    monkeypatch.setattr(supervisor, "gunicorn_command",
                        lambda config, listener: [sys.executable, "-c", "raise SystemExit(3)"])
    config.http.bind, config.http.port = "127.0.0.1", free_tcp_port()  # serve probes it
    assert serve(config, {**NONE, "http": True}) == 1


def test_tftp_port_in_use_fails_at_once_with_the_reason(config, monkeypatch, capfd):
    """The TFTP socket is bound before its thread starts: the error says why, no thread is
    started (so none can print a traceback or be waited for), and nothing is left bound."""
    import socket
    import threading

    from provisiond.boot.supervisor import ServeFailed, Supervisor

    started = []

    class RecordedThread(threading.Thread):
        def start(self):
            started.append(self.name)
            super().start()

    monkeypatch.setattr(supervisor.threading, "Thread", RecordedThread)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        config.tftp.bind, config.tftp.port = "127.0.0.1", taken.getsockname()[1]
        with pytest.raises(ServeFailed, match="Address already in use"):
            Supervisor(config, {**NONE, "tftp": True}).start()
    assert started == []
    assert "Traceback" not in capfd.readouterr().err


SIGTERM_DURING_START = """
import os, signal, sys
from pathlib import Path
from provisiond.boot import supervisor
from provisiond.config import load_config

supervisor.gunicorn_command = lambda config, listener: [
    sys.executable, "-c", "import time; time.sleep(60)"]
started = supervisor.Supervisor._start_http

def start_http(self, listener):
    started(self, listener)
    Path(sys.argv[2]).write_text(str(self.gunicorns[listener].pid))
    os.kill(os.getpid(), signal.SIGTERM)  # as if sent while serve was still starting

supervisor.Supervisor._start_http = start_http
enabled = {"http": True, "dhcp": False, "tftp": False, "dns": False}
sys.exit(supervisor.serve(load_config(Path(sys.argv[1])), enabled))
"""


def test_sigterm_while_starting_stops_cleanly(state_dir, tmp_path):
    """The handlers are in place before anything starts: a SIGTERM during start ends serve
    with 0 and its children stopped, not killed mid-way with gunicorn left running."""
    import os
    import subprocess
    from pathlib import Path

    (state_dir / "provisiond.yaml").write_text(
        f"http: {{bind: 127.0.0.1, port: {free_tcp_port()}}}\n")
    pid_file = tmp_path / "gunicorn.pid"
    repo = Path(__file__).resolve().parents[3]
    log = tmp_path / "serve.log"  # a file, not a pipe: a child left running would hold it
    with open(log, "wb") as out:
        proc = subprocess.run([sys.executable, "-c", SIGTERM_DURING_START, str(state_dir),
                               str(pid_file)], env=dict(os.environ, PYTHONPATH=str(repo)),
                              stdout=out, stderr=subprocess.STDOUT, timeout=30)
    child = int(pid_file.read_text())
    try:
        os.kill(child, 0)
        left = True
    except ProcessLookupError:
        left = False
    if left:
        os.kill(child, signal.SIGKILL)
    assert proc.returncode == 0 and not left, log.read_text()[-1000:]


def test_a_dead_phase_writer_never_fails_the_request(config):
    """Phase records are best effort: with the writer process gone (its pipe broken),
    record() drops the line instead of raising into the DHCP loop or an iPXE request."""
    import os

    from provisiond.boot.phases import PhasePipe
    from provisiond.states import NodePhase

    read_end, write_end = os.pipe()
    os.close(read_end)  # the writer process died
    try:
        pipe = PhasePipe(config, write_end)
        assert pipe.record("n1", NodePhase.IPXE) is False
        assert pipe.dropped == 1
    finally:
        os.close(write_end)


def test_a_udp_port_in_use_names_the_service_and_the_port(config):
    """It said "cannot start the boot services: Address already in use": which of them?"""
    import socket

    from provisiond.boot.supervisor import ServeFailed, Supervisor

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        config.dns.bind, config.dns.port = "127.0.0.1", taken.getsockname()[1]
        with pytest.raises(ServeFailed, match=f"cannot start dns on 127.0.0.1:"
                           f"{config.dns.port}: Address already in use"):
            Supervisor(config, {**NONE, "dns": True}).start()


def test_an_http_port_in_use_is_one_line_before_anything_starts(config):
    """gunicorn found the port taken only after DHCP, DNS and TFTP had started: it retried
    for 5 s, printed ten lines, exited, and serve stopped everything with code 1."""
    import socket

    from provisiond.boot.supervisor import ServeFailed, Supervisor

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config.http.bind, config.http.port = "127.0.0.1", taken.getsockname()[1]
        config.dns.bind, config.dns.port = "127.0.0.1", 0
        server = Supervisor(config, {**NONE, "http": True, "dns": True})
        try:
            with pytest.raises(ServeFailed, match=f"cannot start http on 127.0.0.1:"
                               f"{config.http.port}: Address already in use"):
                server.start()
            assert server.gunicorns == {} and server.udp == []
        finally:
            server.stop()


def test_a_store_error_on_one_phase_leaves_the_writer_recording_the_next(config,
                                                                         monkeypatch):
    """The store away (Unavailable) or a bug for one record: that phase is logged and lost,
    the writer thread goes on and flush() still returns (it waited forever before)."""
    import threading

    from provisiond import status
    from provisiond.boot.phases import PhaseRecorder
    from provisiond.errors import Unavailable
    from provisiond.states import NodePhase

    real = status.record_phase
    failures = {"n1": Unavailable("etcd: no member answers"), "n2": KeyError("a bug")}

    def record_phase(config, node, phase, detail="", **kwargs):
        if node in failures:
            raise failures.pop(node)
        return real(config, node, phase, detail, **kwargs)

    monkeypatch.setattr(status, "record_phase", record_phase)
    recorder = PhaseRecorder(config)
    try:
        for node in ("n1", "n2", "n3"):
            assert recorder.record(node, NodePhase.IPXE)
        flushed = threading.Thread(target=recorder.flush, daemon=True)
        flushed.start()
        flushed.join(30)
        assert not flushed.is_alive(), "flush() never returned: the writer thread died"
        assert status.read_status(config, "n3")["phase"] == "ipxe"
    finally:
        recorder.close()
