"""`provisiond slurm resume`: a resumed node boots anew, so the credential of its previous
boot ends with the resume (as with `node reprovision`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from provisiond.api import create_app
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Bmc
from provisiond.power.fake import read_fake_bmcs
from provisiond.state.layout import Layout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "boot"))
from bootdata import add_image, add_nodes, credential, node_env  # noqa: E402


def test_resume_ends_the_credential_of_the_nodes_previous_boot(config, cli):
    add_nodes(config, 2)
    add_image(config, "tiny")
    with InventoryStore(config).edit() as inventory:
        for name in ("n1", "n2"):
            inventory.nodes[name].bmc = Bmc(driver="fake", address="bmc")
    client = create_app(config).test_client()
    client.application.extensions["provisiond"].watcher.interval = 0
    old = credential(client, 1)  # the running node's, Slurm thinks it powered down

    def report(headers: dict) -> int:
        return client.post("/api/v1/status/n1", data={"phase": "ready", "detail": "x"},
                           environ_base=node_env(1), headers=headers).status_code

    assert report(old) == 200
    assert cli("slurm", "resume", "n[1-2]", "--log", str(config.state_dir / "p.log")).code == 0
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n1"]["boots"] == \
        ["pxe"]
    assert report(old) == 401
    assert report(credential(client, 1)) == 200  # the new boot's agent


def test_programs_run_with_every_descriptor_closed_as_slurmctld_runs_them(config, cli):
    """slurmctld closes all descriptors, stdin to stderr included, before it runs
    ResumeProgram or SuspendProgram: the program still does its work and exits 0."""
    log = config.state_dir / "power.log"
    settings = config.state_dir / "provisiond.yaml"
    data = yaml.safe_load(settings.read_text())
    data["slurm"]["power_log"] = str(log)
    settings.write_text(yaml.safe_dump(data))
    for args in (["node", "add", "n[1-2]", "--runtime-overlay", "slurm", "--bmc-driver", "fake",
                  "--bmc-address", "bmc"], ["slurm", "config"]):
        assert cli(*args).code == 0
    for verb in ("resume", "suspend"):
        done = subprocess.run(["sh", "-c", 'exec 0<&- 1>&- 2>&-; "$0" "$1"',
                               str(Layout.of(config).slurm / verb), "n[1-2]"], timeout=120)
        assert done.returncode == 0, log.read_text()
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert [(bmcs[n]["boots"], bmcs[n]["power"]) for n in ("n1", "n2")] == [(["pxe"], "off")] * 2
    lines = log.read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "slurm resume n1: ok: boot pxe once, power on",
        "slurm resume n2: ok: boot pxe once, power on",
        "slurm suspend n1: ok: off requested", "slurm suspend n2: ok: off requested"]


def _slurm_nodes(config, cli) -> None:
    for args in (["node", "add", "n[1-2]", "--runtime-overlay", "slurm", "--bmc-driver", "fake",
                  "--bmc-address", "bmc"], ["node", "set", "n[1-2]", "--ipaddr", "10.0.0.11"]):
        assert cli(*args).code == 0


def test_suspend_is_a_power_job_audited_with_its_events(config, cli):
    """Like every power command: a job (claims), an audit record, `job.*` events."""
    from provisiond import audit, jobs
    from provisiond.events import read_since

    _slurm_nodes(config, cli)
    result = cli("slurm", "suspend", "n[1-2],zz9", "--log", str(config.state_dir / "p.log"))
    assert result.code == 3, result.err  # zz9 is no node; n1 and n2 were done
    listed, _ = jobs.list_jobs(config)
    assert [(j["kind"], j["target"], j["params"]["action"], j["state"]) for j in listed] == \
        [("power", "n[1-2]", "off", "finished")]
    assert [e["action"] for e in audit.read(config)][-1] == "job.power"
    kinds = [e.kind for e in read_since(config, 0)]
    assert {"job.started", "job.finished"} <= set(kinds), kinds


def test_suspend_leaves_a_node_busy_in_a_provisiond_job_on(config, cli):
    """A node being reprovisioned is not powered off under it: the suspend is refused
    (logged as one line) and no BMC is touched."""
    import os

    from provisiond.jobs import store
    from provisiond.states import JobKind

    _slurm_nodes(config, cli)
    assert cli("power", "on", "n[1-2]").code == 0
    busy = store.create(config, JobKind.REPROVISION, ["n1"], {"timeout": 60}, "cli:test")
    store.record_runner(config, busy.id, os.getpid())
    log = config.state_dir / "p.log"
    result = cli("slurm", "suspend", "n[1-2]", "--log", str(log))
    assert result.code != 0 and "n1 is busy" in log.read_text(), log.read_text()
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert bmcs["n1"]["power"] == "on"


def test_resume_is_a_reprovision_job_that_does_not_wait_for_ready(config, cli):
    """Audited and evented like `node reprovision`, but it ends once the BMCs took the PXE
    boot: Slurm waits for the node itself (no node here ever reports ready)."""
    from provisiond import audit, jobs

    _slurm_nodes(config, cli)
    result = cli("slurm", "resume", "n[1-2]", "--log", str(config.state_dir / "p.log"))
    assert result.code == 0, result.err
    listed, _ = jobs.list_jobs(config)
    assert [(j["kind"], j["target"], j["params"]["wait"], j["state"]) for j in listed] == \
        [("reprovision", "n[1-2]", False, "finished")]
    assert [e["action"] for e in audit.read(config)][-1] == "job.reprovision"
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert [(bmcs[n]["power"], bmcs[n]["boots"]) for n in ("n1", "n2")] == [("on", ["pxe"])] * 2


def test_resume_leaves_a_node_busy_in_a_provisiond_job_alone(config, cli):
    import os

    from provisiond.jobs import store
    from provisiond.states import JobKind

    _slurm_nodes(config, cli)
    busy = store.create(config, JobKind.POWER, ["n1"], {"action": "off"}, "cli:test")
    store.record_runner(config, busy.id, os.getpid())
    log = config.state_dir / "p.log"
    result = cli("slurm", "resume", "n[1-2]", "--log", str(log))
    assert result.code != 0 and "n1 is busy" in log.read_text(), log.read_text()
    assert "n1" not in read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
