"""The status page at `/` in a real headless Chromium, against a real `provisiond serve` on
loopback, with nodes played from loopback addresses (loopback_node): each phase of a boot
reaches the page without a reload, the page asks for a reader token, node text stays text,
and the page fits a phone's width. Screenshots go to test-artifacts/ (listed at the end of
the run)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

import pytest

from loopback_node import prepare
from provisiond.auth import Role, TokenStore
from servers import start_serve, stop_serve, wait_http
from tests.conftest import REPO
from tests.status_page import StatusPage, artifact_path, missing, phases_shown
from tests.waits import wait_until

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")
PHASE_WAIT = 20  # seconds: the page polls every 2 s or follows the event stream
HOSTILE = '<img src=x onerror="document.title=\'owned\'">'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, a reader token, {name: LoopbackNode} n1-n6, the kernel's digest)."""
    state = tmp_path_factory.mktemp("page") / "state"
    config, ports, manifest, nodes = prepare(state, 6)
    token, _ = TokenStore(config).create("status-page", Role.READER)
    proc = start_serve(state)
    base = f"http://127.0.0.1:{ports['http']}"
    try:
        wait_http(f"{base}/boot/ipxe", proc)
        yield base, token, nodes, manifest["kernel"]["digest"]
    finally:
        stop_serve(proc)


def test_the_page_shows_each_phase_of_a_boot_without_a_reload(served):
    base, token, nodes, kernel = served
    for name in ("n1", "n2", "n3"):
        nodes[name].dhcp()
    with StatusPage.open(base, token) as page:
        page.wait_for_phase("n1", "dhcp", PHASE_WAIT)
        page.mark()
        steps = [("ipxe", nodes["n1"].ipxe), ("kernel", lambda: nodes["n1"].kernel(kernel)),
                 ("booted", lambda: nodes["n1"].report("booted")),
                 ("ready", lambda: nodes["n1"].report("ready"))]
        for phase, step in steps:
            step()
            page.wait_for_phase("n1", phase, PHASE_WAIT)
        nodes["n2"].ipxe()
        nodes["n3"].report("failed", "ansible-pull: exit 2")
        page.wait_for_phase("n3", "failed", PHASE_WAIT)
        assert not page.reloaded(), "the page was reloaded to show the change"
        assert page.connection() == "live"  # following GET /api/v1/events with the token
        events = page.driver.execute_script(
            "return [...document.querySelectorAll('#events li')].map(li => [...li.children]"
            ".slice(1).map(e => e.textContent).join(' '));")
        assert "node.phase n1 ready" in events and "node.phase n3 failed (ansible-pull: exit 2)" \
            in events, events
        assert page.text("#summary [data-phase=ready]") == "1 ready"
        assert len(page.driver.find_elements("css selector",
                                              "tr[data-node=n1] .segment")) == 5
        assert page.text("tr[data-node=n3] .detail") == "ansible-pull: exit 2"
        wait_until(lambda: page.driver.find_elements("css selector", "#images tr[data-image]"),
                   PHASE_WAIT, "the images listed")
        assert page.text("#images tr[data-image=tiny] .name") == "tiny"
        assert page.script_errors() == []
        page.screenshot(artifact_path("status-page.png"))


def test_the_page_asks_for_a_reader_token_and_keeps_it_in_the_tab(served):
    base, token, nodes, _ = served
    nodes["n4"].dhcp()
    with StatusPage.open(base) as page:
        wait_until(lambda: page.connection() == "token", PHASE_WAIT, "the page asks for a token")
        assert "reader token" in page.text("#notice")
        assert page.phases() == {}
        page.give_token(token)  # sent as Authorization: Bearer (the status needs a reader)
        page.wait_for_phase("n4", "dhcp", PHASE_WAIT)
        assert not page.driver.find_element("css selector", "#notice").is_displayed()
        assert page.driver.execute_script(
            "return [localStorage.length, document.cookie, sessionStorage.length];") == [0, "", 1]


def test_node_text_is_shown_as_text_never_run(served):
    base, token, nodes, _ = served
    nodes["n5"].report("failed", HOSTILE)
    with StatusPage.open(base, token) as page:
        page.wait_for_phase("n5", "failed", PHASE_WAIT)
        assert page.text("tr[data-node=n5] .detail") == HOSTILE
        assert page.driver.find_elements("css selector", "#nodes img") == []
        assert page.driver.title == "provisiond status"


def test_the_page_fits_a_phone(served):
    base, token, nodes, _ = served
    nodes["n2"].report("ready")
    with StatusPage.open(base, token, width=390, height=844, phone=True) as page:
        page.wait_for_phase("n2", "ready", PHASE_WAIT)
        width, overflow = page.driver.execute_script(
            "return [window.innerWidth, document.documentElement.scrollWidth - window.innerWidth];")
        assert width == 390
        assert overflow <= 0, f"{overflow} px wider than the phone's screen"
        assert page.driver.find_element("css selector", ".timeline .bar").size["width"] >= 40
        page.screenshot(artifact_path("status-page-phone.png"))


def test_the_follow_command_the_lab_runs_in_its_namespace(served, tmp_path):
    """`python -m tests.status_page URL NODE=PHASE`: what the lab test runs where its serve
    is (inside a network namespace), here on loopback. Phases that follow each other within
    milliseconds are each recorded: the page renders every one."""
    base, token, nodes, kernel = served
    nodes["n6"].dhcp()
    (tmp_path / "reader.token").write_text(token + "\n")
    follow = subprocess.Popen([sys.executable, "-m", "tests.status_page", base, "n6=booted",
                               "--token-file", str(tmp_path / "reader.token"), "--timeout",
                               "150", "--screenshots", str(tmp_path / "follow")],
                              cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # generous: Chromium starting on a loaded 2-core machine (60 s was missed once)
        assert select.select([follow.stdout], [], [], 120)[0], "the page did not load in 120 s"
        assert follow.stdout.readline().strip() == "following"
        nodes["n6"].ipxe()
        nodes["n6"].kernel(kernel)
        nodes["n6"].report("booted")
        out, err = follow.communicate(timeout=180)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    result = json.loads(out)
    rows = result["nodes"]["n6"]
    assert phases_shown(rows) == ["dhcp", "ipxe", "kernel", "booted"], rows
    assert rows[-1]["timeline"].startswith("dhcp +0.0 s, ipxe +"), rows[-1]
    assert all(row["when"] for row in rows), rows
    assert result["connection"] == "live" and result["script_errors"] == []
    shots = [Path(shot).name for shot in result["screenshots"]]
    assert shots[0].startswith("follow-00-n6-")
    assert shots[-1] == f"follow-{len(shots) - 1:02d}-end-page.png"
    assert all(Path(shot).stat().st_size > 0 for shot in result["screenshots"])
