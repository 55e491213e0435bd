"""slurm.conf from `provisiond slurm config`, taken by a real slurmctld (Debian's, with a
real munged) in a network namespace of the test's own: the NodeName line is made from what
`slurmd -C` reports for this machine, and `scontrol` shows what the inventory said."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from provisiond.config import load_config
from provisiond.state.layout import Layout
from tests.conftest import run_provisiond
from tests.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vm-lab"))
from pvlab import netns, slurm  # noqa: E402
from pvlab.layout import LabState  # noqa: E402

pytestmark = pytest.mark.netns


def hardware() -> dict[str, str]:
    """`slurmd -C` of this machine: {"CPUs": ..., "RealMemory": ...}."""
    out = subprocess.run([tool("slurmd"), "-C"], capture_output=True, text=True,
                         timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))


@pytest.fixture
def controller():
    """A LabState whose namespace the test made (br0 10.99.77.1), torn down afterwards.
    Its folder is not under pytest's 0700 tmp: munged wants its socket reachable by all."""
    if os.geteuid() != 0 or not all(tool(t) for t in ("slurmctld", "munged", "slurmd",
                                                      "scontrol", "unshare")):
        pytest.skip("needs root and slurmctld, munged, slurmd, scontrol (.ci/install-deps.sh)")
    name = f"pvs-{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/var/tmp"))
    folder.chmod(0o755)
    state = LabState(lab_dir=str(folder), netns=name)
    netns.create_netns(state.netns)
    try:
        yield state
    finally:
        slurm.stop(state)
        netns.delete_netns(state.netns)
        shutil.rmtree(folder, ignore_errors=True)


def provisiond(state: LabState, *args: str) -> str:
    done = run_provisiond(state.state_dir, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def scontrol(state: LabState, *args: str) -> dict[str, str]:
    out = slurm.command(state, "scontrol", "show", *args).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_slurmctld_takes_the_written_conf_with_the_nodes_hardware(controller):
    facts = hardware()
    provisiond(controller, "init", "--address", "10.99.77.1")
    provisiond(controller, "node", "add", "n[1-2]", "--ipaddr", "10.99.77.11",
               "--runtime-overlay", "slurm", "--slurm-cpus", facts["CPUs"],
               "--slurm-real-memory", facts["RealMemory"], "--tag", "partition=batch,debug")
    provisiond(controller, "node", "add", "n3", "--ipaddr", "10.99.77.13",
               "--runtime-overlay", "slurm")
    slurm.configure(controller, 120)
    provisiond(controller, "slurm", "config")
    slurm.start(controller)

    node = scontrol(controller, "node", "n1")
    assert (node["CPUTot"], node["RealMemory"]) == (facts["CPUs"], facts["RealMemory"])
    assert node["NodeAddr"] == "10.99.77.11" and node["Partitions"] == "batch,debug"
    default = scontrol(controller, "node", "n3")
    assert (default["CPUTot"], default["Partitions"]) == ("1", "compute")
    assert scontrol(controller, "partition", "compute")["Default"] == "YES"
    out = slurm.command(controller, "scontrol", "show", "config").stdout
    conf = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", out, re.MULTILINE))
    config = load_config(controller.state_dir)
    assert conf["SuspendTime"] == "120 sec" and conf["ClusterName"] == "pvlab"
    assert conf["ResumeProgram"] == str(Layout.of(config).slurm / "resume")
    assert conf["SuspendProgram"] == str(Layout.of(config).slurm / "suspend")
    assert Path(conf["ResumeProgram"]).stat().st_mode & 0o111


def test_a_resume_whose_bmc_fails_sets_the_node_down_with_the_reason(controller):
    """slurmctld would wait ResumeTimeout (600 s) for a node whose BMC refused to boot it,
    the job held that long: the resume program sets it DOWN at once, saying why."""
    provisiond(controller, "init", "--address", "10.99.77.1")
    provisiond(controller, "node", "add", "n[1-2]", "--ipaddr", "10.99.77.11",
               "--runtime-overlay", "slurm", "--bmc-driver", "fake", "--bmc-address", "bmc")
    provisiond(controller, "node", "set", "n2", "--bmc-address", "unreachable")
    slurm.configure(controller, 120)
    provisiond(controller, "slurm", "config")
    slurm.start(controller)
    config = load_config(controller.state_dir)
    done = slurm.command(controller, "sh", "-c", 'exec "$0" "$1"',
                         str(Layout.of(config).slurm / "resume"), "n[1-2]")
    assert done.returncode != 0
    failed, booted = scontrol(controller, "node", "n2"), scontrol(controller, "node", "n1")
    assert "DOWN" in failed["State"] and "DOWN" not in booted["State"], (failed, booted)
    out = slurm.command(controller, "scontrol", "show", "node", "n2").stdout
    assert re.search(r"Reason=provisiond resume: \S", out), out
