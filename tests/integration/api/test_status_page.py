"""The status page at `/` in a real headless Chromium, against a real `provisiond serve` on
loopback: a phase a node reports reaches the page without a reload, node text stays text,
and the page fits a phone's width. Screenshots go to test-artifacts/ (listed at the end of
the run)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from bootdata import add_image, add_nodes
from provisiond.auth import Role, TokenStore
from provisiond.config import load_config
from servers import loopback_services, start_serve, stop_serve, wait_http
from tests.conftest import REPO
from tests.status_page import StatusPage, artifact_path, missing
from tests.waits import wait_until

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")
PHASE_WAIT = 20  # seconds: the page polls every 2 s or follows the event stream
HOSTILE = '<img src=x onerror="document.title=\'owned\'">'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, a reader token) of a serve with nodes n1-n3 and image tiny."""
    state = tmp_path_factory.mktemp("page") / "state"
    ports = loopback_services(state)
    config = load_config(state)
    add_nodes(config, 3)
    add_image(config, "tiny")
    token, _ = TokenStore(config).create("status-page", Role.READER)
    proc = start_serve(state)
    base = f"http://127.0.0.1:{ports['http']}"
    try:
        wait_http(f"{base}/boot/ipxe", proc)
        yield base, token
    finally:
        stop_serve(proc)


def report(base: str, node: str, phase: str, detail: str = "") -> None:
    """What the node agent does: POST /api/v1/status/<node>."""
    body = urllib.parse.urlencode({"phase": phase, "detail": detail}).encode()
    with urllib.request.urlopen(f"{base}/api/v1/status/{node}", data=body, timeout=10) as answer:
        assert answer.status == 200


def test_the_page_shows_a_phase_change_without_a_reload(served):
    base, token = served
    for node, phase in (("n1", "dhcp"), ("n2", "dhcp"), ("n3", "dhcp")):
        report(base, node, phase)
    with StatusPage.open(base, token) as page:
        page.wait_for_phase("n1", "dhcp", PHASE_WAIT)
        page.mark()
        for phase in ("ipxe", "kernel", "booted", "ready"):
            report(base, "n1", phase)
            page.wait_for_phase("n1", phase, PHASE_WAIT)
        report(base, "n2", "ipxe")
        report(base, "n3", "failed", "ansible-pull: exit 2")
        page.wait_for_phase("n3", "failed", PHASE_WAIT)
        assert not page.reloaded(), "the page was reloaded to show the change"
        assert page.connection() in ("live", "polling")
        assert page.text("#summary [data-phase=ready]") == "1 ready"
        assert len(page.driver.find_elements("css selector",
                                              "tr[data-node=n1] .segment")) == 5
        wait_until(lambda: page.driver.find_elements("css selector", "#images tr[data-image]"),
                   PHASE_WAIT, "the images listed")
        assert page.text("#images tr[data-image=tiny] .name") == "tiny"
        assert page.script_errors() == []
        page.screenshot(artifact_path("status-page.png"))


def test_the_page_asks_for_a_reader_token_and_keeps_it_in_the_tab(served):
    base, token = served
    report(base, "n1", "kernel")
    with StatusPage.open(base) as page:
        wait_until(lambda: page.connection() == "token", PHASE_WAIT, "the page asks for a token")
        assert "reader token" in page.text("#notice")
        assert page.phases() == {}
        page.give_token(token)  # sent as Authorization: Bearer (the status needs a reader)
        page.wait_for_phase("n1", "kernel", PHASE_WAIT)
        assert not page.driver.find_element("css selector", "#notice").is_displayed()
        assert page.driver.execute_script(
            "return [localStorage.length, document.cookie, sessionStorage.length];") == [0, "", 1]


def test_node_text_is_shown_as_text_never_run(served):
    base, token = served
    report(base, "n2", "failed", HOSTILE)
    with StatusPage.open(base, token) as page:
        page.wait_for_phase("n2", "failed", PHASE_WAIT)
        assert page.text("tr[data-node=n2] .detail") == HOSTILE
        assert page.driver.find_elements("css selector", "#nodes img") == []
        assert page.driver.title == "provisiond status"


def test_the_page_fits_a_phone(served):
    base, token = served
    report(base, "n1", "ready")
    with StatusPage.open(base, token, width=390, height=844, phone=True) as page:
        page.wait_for_phase("n1", "ready", PHASE_WAIT)
        width, overflow = page.driver.execute_script(
            "return [window.innerWidth, document.documentElement.scrollWidth - window.innerWidth];")
        assert width == 390
        assert overflow <= 0, f"{overflow} px wider than the phone's screen"
        assert page.driver.find_element("css selector", ".timeline .bar").size["width"] >= 40
        page.screenshot(artifact_path("status-page-phone.png"))


def test_the_follow_command_the_lab_runs_in_its_namespace(served, tmp_path):
    """`python -m tests.status_page URL NODE=PHASE`: what the lab test runs where its serve
    is (inside a network namespace), here on loopback."""
    base, token = served
    report(base, "n3", "dhcp")
    shot = tmp_path / "follow.png"
    follow = subprocess.Popen([sys.executable, "-m", "tests.status_page", base, "n3=booted",
                               "--token", token, "--timeout", "60", "--screenshot", str(shot)],
                              cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([follow.stdout], [], [], 60)[0], "the page did not load in 60 s"
        assert follow.stdout.readline().strip() == "following"
        for phase in ("ipxe", "kernel", "booted"):
            report(base, "n3", phase)
        out, err = follow.communicate(timeout=90)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    seen = json.loads(out)
    assert seen["n3"][0] == "dhcp" and seen["n3"][-1] == "booted", seen
    assert shot.stat().st_size > 0
