"""Fixtures for the power unit tests."""

import pytest

from tests.unit.power.redfish_bmc import start_redfish_bmc


@pytest.fixture
def redfish_bmc():
    """(port, state) of a tiny Redfish BMC on 127.0.0.1, stopped after the test."""
    server, state = start_redfish_bmc()
    yield server.server_address[1], state
    state.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    """Poll tasks, retry busy BMCs and unanswered logins every 50 ms instead of every second."""
    from provisiond.power import base, ipmi, redfish

    monkeypatch.setattr(base, "BUSY_RETRY_DELAY", 0.05)
    monkeypatch.setattr(ipmi, "LOGIN_RETRY_DELAY", 0.05)
    monkeypatch.setattr(redfish, "POLL_SECONDS", 0.05)


@pytest.fixture
def ctx_for():
    """A CLI Context for a state dir (for handlers the lead's nouns call)."""
    from provisiond.cli.context import Context

    return lambda config: Context(str(config.state_dir))
