"""The agent's systemd units and the units ordered after them (ansible-pull overlay, the
debian12-compute image's munge and slurmd drop-ins): what starts when a boot unit fails, and
`systemd-analyze verify` on them all (ExecStart paths swapped for a stub: the node's are not
on this machine)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from provisiond.config import SHIPPED_DIR
from tests.tools import tool

UNITS = SHIPPED_DIR / "overlays/agent/etc/systemd/system"
PULL_UNITS = SHIPPED_DIR / "overlays/ansible-pull/etc/systemd/system"
COMPUTE = SHIPPED_DIR / "images/debian12-compute/files"
DROP_INS = {"slurmd": COMPUTE / "slurmd-provisiond.conf",
            "munge": COMPUTE / "munge-provisiond.conf"}
START, FINISH = "provisiond-agent.service", "provisiond-agent-finish.service"


def unit_settings(path: Path) -> dict[str, set[str]]:
    """The [Unit] section's settings, each the set of its words over all its lines (as
    systemd adds up dependency lists)."""
    settings: dict[str, set[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Unit]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, set()).update(value.split())
    return settings


def test_the_finish_unit_starts_boot_start_first_but_is_not_restarted_with_it():
    """Wants= with After=: starting the finish unit starts boot-start first (again, if it
    failed), and boot-finish does nothing without its runtime overlay. Not Requires= (nor
    BindsTo=, PartOf=): those pass a restart of provisiond-agent.service on to the finish unit
    (the whole configure run again) and to slurmd, which requires it; a failed boot-start then
    left slurmd stopped (tests/integration/test_overlays_agent.py, under systemd itself). sshd
    waits for boot-start only."""
    finish = unit_settings(UNITS / FINISH)
    assert START in finish["Wants"] and START in finish["After"]
    assert not {"Requires", "BindsTo", "PartOf", "Requisite"} & {
        key for key, units in finish.items() if START in units}
    assert "ssh.service" in unit_settings(UNITS / START)["Before"]
    assert "Before" not in finish  # sshd does not wait for the configure run


def test_slurmd_does_not_start_when_the_boots_configure_run_failed():
    """After= only orders: a unit after a failed one starts all the same (systemd.unit(5)).
    slurmd must take no jobs on a node whose configure run failed: it requires the finish
    unit too (a start of slurmd by hand then runs the configure run again first)."""
    slurmd = unit_settings(DROP_INS["slurmd"])
    assert FINISH in slurmd["Requires"] and FINISH in slurmd["After"]


def test_the_timers_configure_run_still_runs_after_a_failed_finish_unit():
    """What brings a node whose boot run failed back to service: the ansible-pull timer's
    unit is only ordered after the finish unit (a Requires= would skip it as slurmd is), and
    its run that goes well starts the finish unit with the units requiring it (slurmd)."""
    pull = unit_settings(PULL_UNITS / "provisiond-ansible-pull.service")
    assert FINISH in pull["After"] and FINISH not in pull.get("Requires", set())
    assert FINISH not in pull.get("Requisite", set()) | pull.get("BindsTo", set())


@pytest.mark.skipif(tool("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_boot_units(tmp_path):
    stub = tmp_path / "provisiond-agent"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    names = []
    for path in [*UNITS.iterdir(), *PULL_UNITS.iterdir()]:
        text = path.read_text().replace("/usr/local/sbin/provisiond-agent", str(stub))
        (tmp_path / path.name).write_text(text)
        names.append(path.name)
    for name in ("ssh", "slurmd", "munge"):  # stand-ins for the image's own units
        (tmp_path / f"{name}.service").write_text(
            f"[Unit]\nDescription=stand-in {name}\n[Service]\nExecStart=/bin/true\n")
        names.append(f"{name}.service")
    for name, drop_in in DROP_INS.items():
        (tmp_path / f"{name}.service.d").mkdir()
        (tmp_path / f"{name}.service.d/10-provisiond.conf").write_text(drop_in.read_text())
    verify = subprocess.run([tool("systemd-analyze"), "verify", "--man=no", *sorted(names)],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"})
    assert verify.returncode == 0 and not (verify.stdout + verify.stderr).strip(), verify
