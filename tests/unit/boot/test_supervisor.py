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
