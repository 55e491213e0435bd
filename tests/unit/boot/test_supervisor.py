"""`provisiond serve`'s supervisor in-process: start failures and the way it ends."""

from __future__ import annotations

import signal
import sys

import pytest

from provisiond.boot import supervisor
from provisiond.boot.supervisor import serve

NONE = {"http": False, "dhcp": False, "tftp": False, "dns": False}


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
                        lambda config: [sys.executable, "-c", "raise SystemExit(3)"])
    assert serve(config, {**NONE, "http": True}) == 1


def test_tftp_port_in_use_fails_at_once_with_the_reason(config):
    """The TFTP socket is bound before its thread starts: the error says why, without a
    thread traceback or a 5 s wait."""
    import socket
    import time

    from provisiond.boot.supervisor import ServeFailed, Supervisor

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        config.tftp.bind, config.tftp.port = "127.0.0.1", taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ServeFailed, match="Address already in use"):
            Supervisor(config, {**NONE, "tftp": True}).start()
    assert time.monotonic() - started < 2
