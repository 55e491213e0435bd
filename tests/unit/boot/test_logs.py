"""The server's log lines: one line per event with its level, text or JSON, no secret."""

from __future__ import annotations

import base64
import json
import logging

import pytest

from provisiond.boot.logs import flush_logs, setup_logging

log = logging.getLogger("provisiond.boot")


@pytest.fixture
def logged(capfd):
    """setup_logging(level, fmt) into the captured stderr; returns a reader of its lines.
    The root logger's handlers are given back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def start(level: str = "DEBUG", fmt: str = "text"):
        setup_logging(level, fmt, interval=3600)

        def lines() -> list[str]:
            flush_logs()
            return capfd.readouterr().err.splitlines()
        return lines

    yield start
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def _raise():
    raise ValueError("first line\nsecond line")


def test_text_lines_carry_the_level_and_stay_one_line_per_event(logged):
    lines = logged("INFO", "text")
    log.info("n1 tftp %s file not found", "a\nFORGED 2099-01-01 INFO provisiond.boot n2 ready")
    log.debug("not at INFO")
    try:
        _raise()
    except ValueError:
        log.exception("a bug")
    out = lines()
    assert len(out) == 2, out
    assert " INFO provisiond.boot n1 tftp a\\nFORGED" in out[0]
    assert " ERROR provisiond.boot a bug\\nTraceback" in out[1] and "second line" in out[1]


def test_json_lines_are_one_object_each(logged):
    lines = logged("DEBUG", "json")
    log.warning("odd\u2028name\x85 %s", "x")
    try:
        _raise()
    except ValueError:
        log.exception("a bug")
    first, second = (json.loads(line) for line in lines())
    assert first["level"] == "WARNING" and first["logger"] == "provisiond.boot"
    assert first["message"] == "odd\u2028name\x85 x" and first["time"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ValueError: first line" in second["exception"]


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("message, secret", [
    ("request headers {'Authorization': 'Bearer pvd_abcdef123456'}", "pvd_abcdef123456"),
    ("Authorization: Basic cm9vdDpjYWx2aW4=", "cm9vdDpjYWx2aW4="),
    ("GET /boot/ipxe?token=tok-8f2a9c&x=1", "tok-8f2a9c"),
    ("body: {\"UserName\": \"root\", \"Password\": \"calvin-secret\"}", "calvin-secret"),
    ("headers: {'X-Auth-Token': 'c3a9e1f0d2'}", "c3a9e1f0d2"),
    ("connect to https://admin:hunter2@10.0.1.5/redfish", "hunter2"),
    ("bmc_password=s3cr3t for n1", "s3cr3t"),
])
def test_credentials_are_masked(logged, fmt, message, secret):
    lines = logged("DEBUG", fmt)
    log.debug("%s", message)
    text = "\n".join(lines())
    assert secret not in text and "<redacted>" in text, text


def test_a_power_call_at_debug_level_logs_no_bmc_password(logged):
    """sushy and urllib3 log requests at DEBUG; neither the password nor the Basic header
    made of it (nor the session token) may reach the log."""
    from provisiond.power.base import BmcSettings
    from provisiond.power.redfish import RedfishDriver
    from provisiond.states import BmcDriver
    from tests.unit.power.redfish_bmc import PASSWORD, USER, start_redfish_bmc

    server, state = start_redfish_bmc()
    lines = logged("DEBUG", "text")
    try:
        settings = BmcSettings(node="n1", driver=BmcDriver.REDFISH, address="127.0.0.1",
                               port=server.server_address[1], scheme="http", username=USER,
                               password=PASSWORD, timeout=10.0)
        RedfishDriver(settings).get_power_state()
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
    text = "\n".join(lines())
    assert "HTTP request: GET" in text  # sushy's debug lines are there
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert PASSWORD not in text and basic not in text
