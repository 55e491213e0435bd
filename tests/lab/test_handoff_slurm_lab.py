"""Issue 14 in the VM lab: two debian12-compute VMs join Slurm, and Slurm's power saving
boots and stops them through provisiond.

Server side: munged and slurmctld in the lab namespace (vm-lab/pvlab/slurm.py), with
slurm.conf from `provisiond slurm config`. Nodes n7 and n8 list the shipped `slurm`
runtime overlay (slurm.conf and the munge key, a secret set with `provisiond secret set`);
their image runs munge and slurmd. Their BMC, for this test, is a sushy-emulator inside the
namespace (pvlab.netns_bmc), where slurmctld's ResumeProgram and SuspendProgram (`provisiond
slurm resume|suspend`) run; power states are checked through the lab's own sushy-tools.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Bmc, Slurm
from provisiond.states import NodePhase
from provisiond.status import read_status
from pvlab import libvirtd, netns_bmc, process, provision, slurm
from pvlab.bmc import BMC_USER

pytestmark = [pytest.mark.lab, pytest.mark.slow]
NODES = ["n7", "n8"]
NETNS_REDFISH_PORT = 8101  # on the lab namespace's loopback
READY_TIMEOUT = 420
REGISTER_TIMEOUT = 240
SUSPEND_TIME = 60  # idle seconds before Slurm suspends a node
SUSPEND_TIMEOUT = 30
RESUME_TIMEOUT = 600
JOB_TIMEOUT = RESUME_TIMEOUT + 120


def enroll(lab, bmc: tuple[str, int]) -> None:
    """n7 and n8 as Slurm nodes: the slurm overlay, 1 CPU and 2 GiB (the VMs have 1 vCPU
    and 3 GiB), a Redfish BMC in the namespace; the munge key as their secret."""
    host, port = bmc
    with InventoryStore(lab.config).edit() as inventory:
        for name in NODES:
            record = inventory.nodes[name]
            overlays = record.runtime_overlays or ["ssh"]
            record.runtime_overlays = [*overlays, *(["slurm"] if "slurm" not in overlays else [])]
            record.slurm = Slurm(cpus=1, real_memory=2048)
            record.bmc = Bmc(driver="redfish", address=host, port=port, scheme="http",
                             system_id=lab.nodes[name].uuid, username=BMC_USER,
                             verify_tls=False)
    provisiond(lab, "secret", "set", "node", ",".join(NODES), slurm.MUNGE_KEY_SECRET,
               "--file", str(slurm.munge_key(lab.state)))


def provisiond(lab, *args: str) -> str:
    return process.run(provision.provisiond_cmd(lab.state, *args),
                       cwd=provision.REPO_ROOT).stdout


def power_off(lab) -> None:
    """The lab's own hands (libvirt), not provisiond's."""
    conn = libvirtd.connect(lab.state)
    for name in NODES:
        domain = conn.lookupByName(lab.nodes[name].domain)
        if domain.isActive():
            domain.destroy()


def redfish_power(lab, name: str) -> str:
    """The node's PowerState as the lab's sushy-tools (on the host's loopback) reports it."""
    host, port = lab.redfish
    url = f"http://{host}:{port}/redfish/v1/Systems/{lab.nodes[name].uuid}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["PowerState"]


def sinfo_states(lab) -> dict[str, str]:
    """Node -> its Slurm state with flags (idle, idle~, alloc#, ...)."""
    out = slurm.command(lab.state, "sinfo", "-h", "-N", "-o", "%N %t").stdout
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def wait_states(lab, wanted: set[str], timeout: float, what: str) -> dict[str, str]:
    return process.wait_for(
        lambda: (states := sinfo_states(lab)) and all(states.get(n) in wanted for n in NODES)
        and states, timeout, f"{what} (sinfo: {sinfo_states(lab)})", interval=2)


def job_field(lab, job: str, field: str) -> str:
    out = slurm.command(lab.state, "scontrol", "show", "job", job).stdout
    found = re.search(rf"\b{field}=(\S*)", out)
    return found.group(1) if found else ""


@pytest.fixture(scope="module")
def slurm_cluster(lab, compute_image, tmp_path_factory):
    """slurmctld and munged up, n7 and n8 booted and registered with slurmd; afterwards
    everything stopped, the nodes powered off and their lab records back."""
    logs = tmp_path_factory.mktemp("slurm")
    power_off(lab)
    try:
        with netns_bmc.redfish_in_netns(lab.state, NETNS_REDFISH_PORT,
                                        logs / "sushy-netns.log") as bmc:
            enroll(lab, bmc)
            slurm.configure(lab.state, SUSPEND_TIME, suspend_timeout=SUSPEND_TIMEOUT,
                            resume_timeout=RESUME_TIMEOUT)
            print(provisiond(lab, "slurm", "config"))
            slurm.start(lab.state)
            lab.boot(NODES)
            statuses = lab.wait_ready(NODES, READY_TIMEOUT)
            for name in NODES:
                assert statuses[name].get("phase") == "ready", \
                    f"{name}: {statuses[name]}\n{lab.serial_tail(name, 20)}"
                print(f"{name} ready: {lab.phase_times(name, statuses[name])}")
            yield
    finally:
        slurm.stop(lab.state)
        power_off(lab)
        provision.register_nodes(lab.state, lab.config)  # their lab records (and BMCs)
        provision.build_overlays(lab.state)


def test_two_vms_join_slurm_and_run_srun(lab, slurm_cluster):
    wait_states(lab, {"idle"}, REGISTER_TIMEOUT, "slurmd on n7 and n8 to register idle")
    out = slurm.command(lab.state, "sinfo", "-N", "-o", "%N %P %c %m %t").stdout
    print(out)
    done = slurm.command(lab.state, "srun", "-N2", "hostname", timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == NODES, done.stdout


def test_power_saving_resumes_and_suspends_nodes_through_provisiond(lab, slurm_cluster):
    wait_states(lab, {"idle"}, REGISTER_TIMEOUT, "slurmd on n7 and n8 to register idle")
    idle_since = time.monotonic()
    wait_states(lab, {"idle~"}, SUSPEND_TIME + SUSPEND_TIMEOUT + 240,
                "Slurm to suspend the idle nodes")
    print(f"suspended {time.monotonic() - idle_since:.0f} s after idle")
    process.wait_for(lambda: all(redfish_power(lab, n) == "Off" for n in NODES), 60,
                     "Redfish to report both nodes Off")

    resumed_after = time.time()
    submitted = time.monotonic()
    out = slurm.command(lab.state, "sbatch", "--parsable", "-N2", "--chdir=/tmp",
                        "--output=/tmp/pvlab-job-%j.out",
                        "--wrap=srun hostname | sort; echo job-done").stdout
    job = out.strip().split(";")[0]
    assert job.isdigit(), out
    state = process.wait_for(
        lambda: job_field(lab, job, "JobState") in ("RUNNING", "COMPLETED", "FAILED")
        and job_field(lab, job, "JobState"), JOB_TIMEOUT, f"job {job} to start "
        f"(squeue: {slurm.command(lab.state, 'squeue').stdout})", interval=2)
    started = time.monotonic() - submitted
    print(f"sbatch to job start (nodes powered off at submit): {started:.0f} s")
    assert state != "FAILED", job_field(lab, job, "Reason")
    for name in NODES:
        status = read_status(lab.config, name) or {}
        assert status.get("boot_started", 0) >= resumed_after, status  # a new PXE boot
        assert status.get("phase") == NodePhase.READY.value, status
    process.wait_for(lambda: job_field(lab, job, "JobState") == "COMPLETED", 120,
                     f"job {job} to complete", interval=2)
    batch_host = job_field(lab, job, "BatchHost")
    output = lab.ssh(batch_host, f"cat /tmp/pvlab-job-{job}.out")
    assert output.stdout.split() == [*NODES, "job-done"], output.stdout + output.stderr
    print((slurm.slurm_dir(lab.state) / "log" / "power.log").read_text())

    idle_since = time.monotonic()
    wait_states(lab, {"idle~"}, SUSPEND_TIME + SUSPEND_TIMEOUT + 240,
                "Slurm to suspend the nodes again after the job")
    print(f"suspended again {time.monotonic() - idle_since:.0f} s after the job")
    process.wait_for(lambda: all(redfish_power(lab, n) == "Off" for n in NODES), 60,
                     "Redfish to report both nodes Off again")
