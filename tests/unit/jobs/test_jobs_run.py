"""Starting jobs (the checks made before anything is stored) and running them: per-target
results through the same library calls as the CLI, the events they emit, a failed build."""

from __future__ import annotations

import json
import time

import pytest

from provisiond import audit, events, jobs
from provisiond.errors import InvalidInput, NodeNotFound, NotFound, ProvisiondError
from provisiond.jobs import runner, store, work
from provisiond.jobs.model import JobResult
from provisiond.journal import MAX_LINE
from provisiond.power.fake import read_fake_bmcs
from provisiond.states import JobKind, JobState, NodePhase


@pytest.fixture
def nodes(cli):
    assert cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    return cli


def run_here(config, kind, names, params):
    """A job recorded as start() records it, run in this process; its ended record."""
    return jobs.run_here(config, kind, names, params, "cli:test")


def kinds_of(config) -> list[str]:
    """The kinds of the job and build events in the journal, oldest first."""
    return [e.kind for e in events.read_since(config, 0, kinds=frozenset({"job.", "build."}))]


@pytest.mark.parametrize("kind, names, params, error, message", [
    ("dance", ["n1"], {}, InvalidInput, "no job kind 'dance'"),
    ("power", ["n1"], {"action": "explode"}, InvalidInput, "action: Input should be"),
    ("power", ["n1"], {"action": "on", "force": True}, InvalidInput, "force: unknown field"),
    ("power", ["n1"], {"action": "on", "timeout": 0}, InvalidInput, "timeout: 0.0 is outside"),
    ("power", [], {"action": "on"}, InvalidInput, "name at least one node"),
    ("power", ["n[1-5]"], {"action": "on"}, NodeNotFound, "no such node: n[4-5]"),
    ("power", ["n[1-"], {"action": "on"}, InvalidInput, "invalid node range"),
    ("firmware-update", ["n1"], {"image": "ftp://x/b.bin"}, InvalidInput, "not an http(s) URL"),
    ("firmware-update", ["n1"], {"image": "http://x/a\nb"}, InvalidInput, "not an http(s)"),
    ("image-build", ["nosuch"], {}, NotFound, "no recipe for image 'nosuch'"),
    ("image-build", ["Bad_Name"], {}, InvalidInput, "Bad_Name"),
    ("image-build", ["tiny", "other"], {}, InvalidInput, "names one image"),
    ("overlay-build", ["n1"], {"all": True}, InvalidInput, "not both"),
])
def test_bad_requests_store_nothing(nodes, config, kind, names, params, error, message):
    with pytest.raises(error) as caught:
        jobs.start(config, kind, names, params, "token:t")
    assert message in str(caught.value)
    assert store.job_ids(config) == []


def test_a_power_job_has_a_result_per_node_and_tells_the_journal(nodes, config):
    nodes("node", "add", "n4", "--bmc-driver", "fake", "--bmc-address", "unreachable")
    job = run_here(config, JobKind.POWER, ["n[1-4]"], {"action": "on"})
    assert job.state is JobState.FAILED and job.started <= job.finished
    assert [(r.name, r.result) for r in job.results] == [
        ("n1", "ok"), ("n2", "ok"), ("n3", "ok"), ("n4", "error")]
    assert job.results[0].detail == "on requested"
    assert job.message == "1 of 4 failed; n4: fake BMC of n4 is unreachable"
    assert {n: s["power"] for n, s in read_fake_bmcs(
        config.state_dir / "power" / "fake-bmcs.json").items()} == {
        "n1": "on", "n2": "on", "n3": "on"}
    seen = kinds_of(config)
    assert seen[0] == "job.started" and seen[-1] == "job.finished"
    progress = events.read_since(config, 0, kinds=frozenset({"job.progress"}))
    assert sorted(r["name"] for e in progress for r in e.data["results"]) == [
        "n1", "n2", "n3", "n4"]
    finished = events.read_since(config, 0, kinds=frozenset({"job.finished"}))[0]
    assert finished.subject == "job/1" and (finished.data["ok"], finished.data["error"]) == (3, 1)
    assert store._read_index(config).active == {}  # its claims are freed


def test_status_and_bootdev_jobs_call_what_the_cli_calls(nodes, config):
    run_here(config, JobKind.POWER, ["n1"], {"action": "on"})
    status = run_here(config, JobKind.POWER, ["n[1-2]"], {"action": "status"})
    assert [(r.name, r.detail) for r in status.results] == [("n1", "on"), ("n2", "off")]
    assert status.state is JobState.FINISHED and status.message is None
    boot = run_here(config, JobKind.BOOTDEV, ["n2"], {"device": "pxe", "uefi": True})
    assert boot.results[0].detail == "pxe once"
    assert read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")["n2"]["boot"] == {
        "device": "pxe", "persistent": False, "uefi": True}
    update = run_here(config, JobKind.FIRMWARE_UPDATE, ["n3"], {"image": "http://h/b.bin"})
    assert update.results[0].detail == "BIOS updated to 1.1.0"


def test_a_node_deleted_before_the_runner_starts_fails_the_job(nodes, config):
    job = store.create(config, JobKind.POWER, ["n1"], {"action": "on", "timeout": None}, "t")
    nodes("node", "delete", "n1", "--yes")
    runner.run(config, job.id)
    job = store.read(config, job.id)
    assert job.state is JobState.FAILED and job.message == "no such node: n1"
    assert [(r.name, r.result, r.detail) for r in job.results] == [
        ("n1", "error", "no such node: n1")]


def test_an_image_build_without_root_fails_the_job_clearly(config, monkeypatch):
    monkeypatch.setattr(work.os, "geteuid", lambda: 1000)
    job = run_here(config, JobKind.IMAGE_BUILD, ["tiny"], {})
    assert job.state is JobState.FAILED
    assert job.message.startswith("image tiny: building needs root (chroot and mounts) and "
                                  "the server runs as uid 1000")
    assert [(r.name, r.result) for r in job.results] == [("tiny", "error")]


def test_an_overlay_build_job_reports_each_node_and_emits_build_events(nodes, config):
    job = run_here(config, JobKind.OVERLAY_BUILD, ["n[1-2]"], {})
    assert job.state is JobState.FINISHED, job.message
    assert [(r.name, r.result, r.detail) for r in job.results] == [
        ("n1", "ok", "built"), ("n2", "ok", "built")]
    builds = events.read_since(config, 0, kinds=frozenset({"build."}))
    assert [(e.kind, e.subject) for e in builds] == [
        ("build.started", "overlays/n[1-2]"), ("build.finished", "overlays/n[1-2]")]
    assert builds[1].data["rebuilt"]["system"] == 2


def test_a_failed_overlay_build_fails_the_job_and_the_build(nodes, config):
    overlay = config.state_dir / "overlays" / "broken" / "etc"
    overlay.mkdir(parents=True)
    (overlay / "bad.j2").write_text("{{ node.no_such_field }}\n")
    assert nodes("node", "set", "n2", "--system-overlay", "broken").code == 0
    job = run_here(config, JobKind.OVERLAY_BUILD, ["n[1-2]"], {})
    assert job.state is JobState.FAILED
    assert [(r.name, r.result) for r in job.results] == [("n1", "ok"), ("n2", "error")]
    assert "no_such_field" in job.results[1].detail
    assert kinds_of(config)[-2:] == ["build.failed", "job.finished"]


def test_progress_events_fit_journal_lines(config, monkeypatch):
    """Results arriving at once are split across events that the journal accepts."""
    job = store.create(config, JobKind.POWER, [f"n{i}" for i in range(300)], {}, "t")
    progress = work.Progress(config, job)
    monkeypatch.setattr(work, "FLUSH_SECONDS", 3600)
    progress.flushed = time.monotonic()
    for i in range(300):
        job.results.append(JobResult(name=f"n{i}", result="error", detail="x" * 5000))
        progress.batch.append(job.results[-1])
    progress.flush()
    sent = events.read_since(config, 0)
    assert len(sent) > 1 and sum(len(e.data["results"]) for e in sent) == 300
    assert all(len(json.dumps(e.model_dump())) < MAX_LINE for e in sent)


def test_a_started_job_runs_in_its_own_process(nodes, config):
    job = jobs.start(config, "power", ["n[1-3]"], {"action": "cycle"}, "cli:test")
    assert job["state"] in ("pending", "running") and job["runner_pid"]
    deadline = time.monotonic() + 60
    while jobs.get(config, job["id"])["state"] in ("pending", "running"):
        assert time.monotonic() < deadline, store.log_path(config, job["id"]).read_text()
        time.sleep(0.05)
    done = jobs.get(config, job["id"])
    assert done["state"] == "finished" and done["runner_pid"] == job["runner_pid"]
    assert [r["detail"] for r in done["results"]] == ["cycle requested"] * 3
    with pytest.raises(ProvisiondError):
        jobs.get(config, 99)


def test_a_job_over_scattered_nodes_fits_audit_and_event_lines(config, monkeypatch):
    """4,000 names that fold to ~20 KB: the target shown is bounded (a journal line holds
    16 KiB), so the job is audited and its events are written."""
    from provisiond.inventory import InventoryStore
    from provisiond.inventory.model import Bmc, Record

    names = [f"n{2 * i}" for i in range(1, 4001)]
    with InventoryStore(config).edit() as inventory:
        for name in names:
            inventory.nodes[name] = Record(bmc=Bmc(driver="fake", address="bmc"))
    monkeypatch.setattr(runner, "spawn", lambda config, job_id: 1)
    job = jobs.start(config, "power", [",".join(names)], {"action": "status"}, "cli:test")
    assert len(job["names"]) == 4000 and len(job["target"]) < 2100
    assert job["target"].endswith(",... (4000 nodes)")
    assert audit.read(config)[-1]["target"] == job["target"]
    record = store.read(config, job["id"])
    assert events.emit(config, "job.started", "job/1", runner._summary(record)) is not None


def test_a_reprovision_job_waits_for_each_node(nodes, config):
    """PXE once, power cycle, then ready or failed per node, as `node reprovision` does."""
    from tests.unit.power.test_reprovision import boot_when_cycled

    agent = boot_when_cycled(config, {"n1": [NodePhase.DHCP, NodePhase.READY],
                                      "n2": [NodePhase.DHCP, NodePhase.FAILED]})
    job = run_here(config, JobKind.REPROVISION, ["n[1-2]"], {"timeout": 3600})
    agent.join(10)
    assert job.state is JobState.FAILED
    assert [(r.name, r.result) for r in job.results] == [("n1", "ok"), ("n2", "error")]
    assert job.results[0].detail.startswith("ready after")
    assert job.results[1].detail.startswith("boot failed")
    boots = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert boots["n1"]["boots"] == ["pxe"] and boots["n2"]["boots"] == ["pxe"]
