"""Issue 12 in the VM lab: one VM booted to `ready` through the HTTP API only.

examples/inventory_sync.py, run in the lab namespace against the lab's `provisiond serve`,
registers n5 from a CSV (its MAC, address and Redfish BMC on the lab's sushy-tools), sets its
BMC password, builds its overlays as an API job, powers it on as an API job and follows
`GET /api/v1/events` until n5 reports `ready`. No provisiond CLI call but the documented
bootstrap, `provisiond token create`; n5's earlier lab record is removed through the API too.

While n5 boots, the status page (`/` on the serve's API address) is open in a headless
Chromium inside the lab namespace (tests.status_page, run there as a command): without a
reload it must render n5's row in every phase the event stream brought, in order, to
`ready`, each with the time it was reached and a timeline of the boot so far. Screenshots of
each phase go to test-artifacts/lab-status-*.png.

The lab's own BMC emulators listen on the host's loopback, where the test process drives them;
`provisiond serve`, and so the runner of its power jobs, lives in the lab namespace, whose
loopback is another. The fixture `redfish_in_netns` runs sushy-emulator with the lab's
settings (same libvirtd, so the same domains) on the namespace's loopback for the serve.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from provisiond.states import NodePhase
from provisiond.status import read_status
from pvlab import libvirtd, netns_bmc, process, provision
from pvlab.bmc import BMC_PASSWORD, BMC_USER
from pvlab.layout import SERVER_ADDRESS
from tests.status_page import SAVED, artifact_path, missing, phases_shown

pytestmark = [pytest.mark.lab, pytest.mark.slow]
NODE = "n5"  # bios, tiny image, an odd node: Redfish
EXAMPLE = provision.REPO_ROOT / "examples" / "inventory_sync.py"
READY_TIMEOUT = 300
NETNS_REDFISH_PORT = 8100  # on the lab namespace's loopback
PAGE_LOAD_TIMEOUT = 180  # Chromium starting in the namespace, the first status read (90)
PHASE_ORDER = [phase.value for phase in NodePhase]
CLOCK = re.compile(r"^(\d\d):(\d\d):(\d\d)$")  # the page's Updated cell, same day (UTC)


@pytest.fixture
def redfish_in_netns(lab, tmp_path):
    """(host, port) of a sushy-emulator in the lab namespace, stopped (by PID) afterwards."""
    with netns_bmc.redfish_in_netns(lab.state, NETNS_REDFISH_PORT,
                                    tmp_path / "sushy-netns.log") as address:
        yield address


def curl(lab, token: str, *args: str) -> str:
    """The HTTP code of a curl to the lab's serve, run in the lab namespace."""
    result = process.run(["curl", "-gsS", "--max-time", "20", "-o", "/dev/null", "-w",
                          "%{http_code}", "-H", f"Authorization: Bearer {token}", *args],
                         netns=lab.netns, check=False, timeout=30)
    return result.stdout.strip()


def token(lab, role: str, folder) -> tuple[str, str]:
    """(token, path of a 0600 file holding it), made by `provisiond token create`."""
    name = f"lab-sync-{role}-{int(time.time())}"
    value = process.run(provision.provisiond_cmd(lab.state, "token", "create", "--role", role,
                                                 "--name", name)).stdout.strip()
    path = folder / f"{role}.token"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value, str(path)


@pytest.fixture
def status_page(lab, tmp_path):
    """A function that opens the status page in Chromium inside the lab namespace, following
    it until NODE shows `ready` (tests.status_page as a command); returns its Popen. It is
    killed (by PID) afterwards if still running."""
    if missing():
        pytest.skip(missing())
    started: list[subprocess.Popen] = []

    def follow(url: str, token_file: str) -> subprocess.Popen:
        argv = process.in_netns([sys.executable, "-m", "tests.status_page", url,
                                 f"{NODE}=ready", "--token-file", token_file, "--timeout",
                                 str(READY_TIMEOUT + 60), "--screenshots",
                                 str(artifact_path("lab-status"))], lab.netns)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(
            tmp_path / "status-page.log", "w"), text=True, cwd=provision.REPO_ROOT,
            env=dict(os.environ, TZ="UTC"), start_new_session=True)
        started.append(proc)
        if not select.select([proc.stdout], [], [], PAGE_LOAD_TIMEOUT)[0]:
            raise TimeoutError(f"the status page did not load in {PAGE_LOAD_TIMEOUT} s")
        line = proc.stdout.readline().strip()
        assert line == "following", f"{line}\n{(tmp_path / 'status-page.log').read_text()}"
        return proc

    yield follow
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()


def page_result(proc: subprocess.Popen, log) -> dict:
    """What the status page follower saw (tests.status_page's JSON line)."""
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        out = ""
    assert proc.returncode == 0, f"the page follower: exit {proc.returncode}\n{log.read_text()}"
    result = json.loads(out.strip().splitlines()[-1])
    SAVED.extend(map(Path, result["screenshots"]))
    return result


def seconds_of_day(epoch: float) -> float:
    moment = datetime.fromtimestamp(epoch, timezone.utc)
    return moment.hour * 3600 + moment.minute * 60 + moment.second + moment.microsecond / 1e6


def timeline_steps(label: str) -> list[tuple[str, float]]:
    """The page's timeline label ("dhcp +0.0 s, ipxe +4.2 s, kernel +1 min 3 s") as
    (phase, seconds from the boot's start)."""
    steps = []
    for part in label.split(", "):
        phase, _, offset = part.partition(" +")
        found = re.fullmatch(r"(?:(\d+) min )?([\d.]+) s", offset)
        assert found, f"no offset in the timeline step {part!r}"
        steps.append((phase, int(found.group(1) or 0) * 60 + float(found.group(2))))
    return steps


def check_times_shown(rows: list[dict], phases: dict[str, float]) -> None:
    """Each state the page showed of n5 in a phase names when it was reached (the Updated
    cell: HH:MM:SS, the browser in UTC) and a timeline of the boot so far, each phase at its
    offset from the boot's start, in order. The last state shown in each phase names the
    server's time of that phase, to the second (a few seconds allowed: the page shows the
    event's time, taken just after the phase's)."""
    for i, row in enumerate(rows):
        if row["phase"] == "no report":
            continue
        found = CLOCK.match(row["when"])
        assert found, f"no time shown for {row}"
        steps = timeline_steps(row["timeline"])
        assert steps[-1][0] == row["phase"] and steps[0][0] == "dhcp", row
        assert [offset for _, offset in steps] == sorted(offset for _, offset in steps), row
        if i + 1 < len(rows) and rows[i + 1]["phase"] == row["phase"]:
            continue  # e.g. the PXE ROM's DHCP, then iPXE's: the server keeps the later one
        assert row["phase"] in phases, f"{row} is not a phase of the boot: {phases}"
        hours, minutes, secs = map(int, found.groups())
        gap = (hours * 3600 + minutes * 60 + secs - seconds_of_day(phases[row["phase"]])) % 86400
        assert min(gap, 86400 - gap) < 5, f"{row} vs the server's {phases}"


def power_off(lab) -> None:
    """The lab's own hands (libvirt), not provisiond's: n5 off as other tests expect."""
    domain = libvirtd.connect(lab.state).lookupByName(lab.nodes[NODE].domain)
    if domain.isActive():
        domain.destroy()


def test_a_vm_boots_to_ready_through_the_api_only(lab, redfish_in_netns, status_page,
                                                 tmp_path):
    node = lab.nodes[NODE]
    admin, admin_file = token(lab, "admin", tmp_path)
    _, operator_file = token(lab, "operator", tmp_path)
    _, reader_file = token(lab, "reader", tmp_path)
    url = lab.serve["url"]
    assert curl(lab, admin, "-X", "DELETE", f"{url}/api/v1/nodes/{NODE}") in ("204", "404")
    page = status_page(url, reader_file)  # opened once n5 and its earlier phases are gone
    host, port = redfish_in_netns
    csv = tmp_path / "inventory.csv"
    csv.write_text("name,mac,ipaddr,netmask,gateway,profile,image,bmc_driver,bmc_address,"
                   "bmc_port,bmc_username,bmc_scheme,bmc_system_id\n"
                   f"{NODE},{node.mac},{node.ipaddr},255.255.255.0,{SERVER_ADDRESS},default,"
                   f"{node.image},redfish,{host},{port},{BMC_USER},http,{node.uuid}\n")
    (tmp_path / "bmc-password").write_text(BMC_PASSWORD + "\n")
    power_off(lab)
    started = time.monotonic()
    try:
        done = process.run(
            [sys.executable, str(EXAMPLE), str(csv), "--url", url, "--token-file", admin_file,
             "--operator-token-file", operator_file, "--bmc-password-file",
             str(tmp_path / "bmc-password"), "--build-overlays", "--power-on", "--wait",
             str(READY_TIMEOUT)], netns=lab.netns, check=False, timeout=READY_TIMEOUT + 60,
            cwd=provision.REPO_ROOT)
        print(done.stdout, f"({time.monotonic() - started:.1f} s)")
        assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{lab.serial_tail(NODE, 15)}"
        shown = page_result(page, tmp_path / "status-page.log")
        server_phases = read_status(lab.config, NODE)["phases"]
    finally:
        power_off(lab)
        # n5's lab record back (its BMC is the lab's sushy-tools on the host's loopback,
        # not this test's emulator), with overlays to match, as later lab tests expect
        provision.register_nodes(lab.state, lab.config)
        provision.build_overlays(lab.state)
    lines = done.stdout.splitlines()
    assert lines[0] == f"{NODE}: created", lines
    assert lines[-1] == f"ready: {NODE}", lines
    phases = [line.split()[1] for line in lines if line.startswith(f"{NODE}: ")][1:]
    assert phases[0] == "dhcp" and "kernel" in phases and phases[-1] == "ready", phases

    # the page, never reloaded, rendered n5 in every phase the event stream brought, in
    # order, each with its time and the boot's timeline
    rows = shown["nodes"][NODE]
    on_page = [phase for phase in phases_shown(rows) if phase != "no report"]
    assert on_page == [p for i, p in enumerate(phases) if not i or phases[i - 1] != p], \
        (on_page, phases)
    assert [PHASE_ORDER.index(phase) for phase in on_page] == sorted(
        PHASE_ORDER.index(phase) for phase in on_page), on_page
    assert on_page[0] == "dhcp" and on_page[-1] == "ready"
    assert set(server_phases) <= set(on_page), (server_phases, on_page)
    check_times_shown(rows, server_phases)
    assert shown["connection"] == "live" and shown["script_errors"] == [], shown
    assert any(shot.endswith(f"-{NODE}-ready.png") for shot in shown["screenshots"])
