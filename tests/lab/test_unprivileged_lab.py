"""The lab booted from `provisiond serve` run as the systemd unit runs it, and `provisiond
doctor` on the lab's healthy setup. Named to run after the other lab tests: it reuses the
session's lab (its tiny image and overlays, no rebuild), swaps the lab's root serve for an
unprivileged one for one boot, and puts everything back as it found it.

The unit's user, capabilities and file system options come from the shipped unit's text
(tests/service_sandbox.py: setpriv and bwrap, there being no systemd as PID 1 here)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from provisiond.cli.ownership import hand_back
from pvlab import process, provision, report
from pvlab.errors import LabError
from tests.service_sandbox import (argv_of, descendants, effective_capabilities,
                                   process_uid, sandbox_argv, service_python)

pytestmark = pytest.mark.lab
UID = 64123  # the unit's provisiond user, any unprivileged uid
CAP_NET_BIND_SERVICE = 10
TINY = "n[1-3],n5"  # the lab's tiny nodes (n4's debian12 is built by one slow test only)


def doctor(lab, *args: str) -> tuple[int, list[dict]]:
    """`provisiond doctor --json` as root inside the lab's namespace."""
    done = process.run(provision.provisiond_cmd(lab.state, "doctor", "--json", *args),
                       netns=lab.netns, check=False, timeout=120, cwd=provision.REPO_ROOT)
    return done.returncode, json.loads(done.stdout or "[]")


def failures(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["level"] == "fail"]


def test_doctor_passes_on_the_labs_healthy_setup(lab):
    """In the namespace (ports held by serve, br0, iPXE files, images, overlays); the BMCs,
    on 127.0.0.1 outside it, are asked from here."""
    from provisiond.preflight.nodes import check_nodes

    code, findings = doctor(lab, TINY, "--no-bmc")
    assert code == 0 and not failures(findings), failures(findings)
    listeners = {f["subject"].split()[0]: f["detail"] for f in findings
                 if f["check"] == "listener"}
    assert set(listeners) == {"http", "dhcp", "tftp", "dns"}, listeners
    assert all(d.startswith("in use by provisiond serve") for d in listeners.values())
    bmcs = [f for f in check_nodes(lab.config, TINY, bmc=True) if f.check == "bmc"]
    assert len(bmcs) == 4 and all(f.level == "ok" for f in bmcs), bmcs


def test_a_vm_boots_from_serve_run_as_the_unit_runs_it(lab):
    state = lab.state
    provision.stop_serve(state)
    os.chown(state.state_dir, UID, UID)
    hand_back(state.state_dir, UID, UID)
    python = service_python(state.dir / "unprivileged")
    argv = [*sandbox_argv(UID, UID, [state.state_dir], [state.dir / "unprivileged"]),
            str(python), "-m", "provisiond", "--state-dir", str(state.state_dir), "serve"]
    log = state.dir / "logs" / "serve-unprivileged.log"
    try:
        state.pids["serve"] = process.spawn(argv, log, netns=lab.netns)  # down() stops it
        state.save()
        process.wait_for(lambda: provision.serve_answers(state), 60, "the unprivileged serve")
        served = [pid for pid in descendants(state.pids["serve"])
                  if any(b"provisiond" in word for word in argv_of(pid))]
        assert served and all(process_uid(p) == UID for p in served), served
        assert {effective_capabilities(p) for p in served} == {1 << CAP_NET_BIND_SERVICE}
        code, findings = doctor(lab, "n1", "--no-bmc")  # the unit's setup is healthy too
        assert code == 0 and not failures(findings), failures(findings)
        lab.boot(["n1"])
        statuses = lab.wait_ready(["n1"], timeout=480)  # TCG on 2 shared cores
        print("\n" + report.format_table(report.status_rows(lab, statuses)))
        assert statuses["n1"].get("phase") == "ready", (
            f"{statuses}\n{report.failure_report(lab, statuses)}\n"
            f"{log.read_text(errors='replace')[-3000:]}")
        assert os.stat(state.state_dir / "status" / "n1.json").st_uid == UID
    finally:
        _stop(state.pids.pop("serve", None))
        _give_back_to_root(state.state_dir)
        lab.start_serve()  # as the lab had it


def _stop(sandbox: int | None) -> None:
    """SIGTERM to serve itself, as systemd sends it (bwrap forwards no signal), then wait
    for the sandbox to end; what is left is stopped by pid."""
    for pid in descendants(sandbox) if process.alive(sandbox) else []:
        argv = argv_of(pid)
        if b"provisiond" in argv and b"serve" in argv:
            os.kill(pid, signal.SIGTERM)
    try:
        process.wait_for(lambda: not process.alive(sandbox), 30, "the unprivileged serve")
    except LabError:
        process.stop(sandbox, "serve", timeout=15)


def _give_back_to_root(state_dir) -> None:
    for folder, dirs, files in os.walk(state_dir):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if os.lstat(path).st_uid == UID:
                os.lchown(path, 0, 0)
    os.chown(state_dir, 0, 0)
