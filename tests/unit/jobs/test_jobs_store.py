"""The job store: claims on targets (409 naming the job), runners that died, the bounded
history, ids never reused, an unreadable index, listing pages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisiond import jobs
from provisiond.errors import Conflict, JobNotFound
from provisiond.jobs import store
from provisiond.states import JobKind, JobState
from provisiond.state.layout import Layout


def new_job(config, names, kind=JobKind.POWER, actor="cli:test"):
    return store.create(config, kind, names, {"action": "on"}, actor)


def finish(config, job, state=JobState.FINISHED):
    job.state = state
    store.finish(config, job)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def live_process():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_busy_node_is_a_conflict_naming_the_job(config):
    first = new_job(config, ["n1", "n2"], actor="token:netbox")
    with pytest.raises(Conflict) as caught:
        new_job(config, ["n2", "n3"])
    assert str(caught.value) == ("node n2 is busy: job 1 (power n[1-2], by token:netbox) is "
                                 "pending")
    assert store.job_ids(config) == [first.id]  # nothing stored for the refused job
    assert new_job(config, ["n3"]).id == 2


def test_claims_are_per_kind_of_target(config):
    new_job(config, ["n1"])
    overlays = new_job(config, ["n1"], kind=JobKind.OVERLAY_BUILD)
    image = new_job(config, ["tiny"], kind=JobKind.IMAGE_BUILD)
    with pytest.raises(Conflict, match="the overlays of node n1 is busy: job 2"):
        new_job(config, ["n1"], kind=JobKind.OVERLAY_BUILD)
    with pytest.raises(Conflict, match="image tiny is busy: job 3"):
        new_job(config, ["tiny"], kind=JobKind.IMAGE_BUILD)
    assert (overlays.target, image.target) == ("n1", "tiny")


def test_a_finished_job_frees_its_nodes(config):
    job = new_job(config, ["n1"])
    finish(config, job)
    assert new_job(config, ["n1"]).id == 2


def test_a_dead_runner_frees_its_claims_and_fails_its_job(config):
    job = new_job(config, ["n1"])
    store.record_runner(config, job.id, dead_pid())
    assert new_job(config, ["n1"]).id == 2
    failed = store.read(config, job.id)
    assert failed.state is JobState.FAILED and failed.finished
    assert f"runner (pid {failed.runner_pid}) ended without finishing" in failed.message


def test_a_live_runner_keeps_its_claims(config):
    job = new_job(config, ["n1"])
    runner = live_process()
    try:
        store.record_runner(config, job.id, runner.pid)
        with pytest.raises(Conflict):
            new_job(config, ["n1"])
        assert store.get(config, job.id).state is JobState.PENDING
    finally:
        runner.kill()
        runner.wait()
    assert store.get(config, job.id).state is JobState.FAILED


def test_a_reused_pid_is_not_the_runner(config):
    """Another process now holding the runner's pid (another start time) holds no claim."""
    job = new_job(config, ["n1"])
    other = live_process()
    try:
        store.record_runner(config, job.id, other.pid)
        recorded = store.read(config, job.id)
        recorded.runner_start -= 1  # the runner started at another time than this process
        store.save(config, recorded)
        assert new_job(config, ["n1"]).id == 2
    finally:
        other.kill()
        other.wait()


def test_a_runner_never_recorded_holds_its_claims_for_the_grace_only(config, monkeypatch):
    job = new_job(config, ["n1"])
    with pytest.raises(Conflict):
        new_job(config, ["n1"])
    monkeypatch.setattr(store, "SPAWN_GRACE", 0.0)
    assert new_job(config, ["n1"]).id == 2
    assert "no runner started within 0 s" in store.read(config, job.id).message


def test_a_job_begins_once(config):
    job = new_job(config, ["n1"])
    assert store.begin(config, job.id, 4242).state is JobState.RUNNING
    assert store.begin(config, job.id, 4242) is None


def test_the_history_keeps_the_newest_jobs_and_never_reuses_an_id(config, monkeypatch):
    monkeypatch.setattr(store, "MAX_HISTORY", 3)
    running = new_job(config, ["r1"])
    for i in range(6):
        job = new_job(config, [f"n{i}"])
        store.log_path(config, job.id).write_text("log\n")
        finish(config, job)
    assert store.job_ids(config) == [7, 6, 5, 1]  # and the still active one
    assert not store.log_path(config, 2).exists() and store.log_path(config, 5).exists()
    with pytest.raises(JobNotFound, match="job 2 is no longer kept"):
        store.read(config, 2)
    (Layout.of(config).jobs / "index.json").unlink()
    assert new_job(config, ["n9"]).id == 8
    assert running.id == 1


def test_the_history_is_bounded_in_bytes_too_keeping_the_newest(config, monkeypatch):
    """Large records (a 10,000-node power status) are dropped by size, oldest first, the
    newest MIN_HISTORY kept even when they alone are over the bound."""
    monkeypatch.setattr(store, "MAX_HISTORY_BYTES", 10_000)
    monkeypatch.setattr(store, "MIN_HISTORY", 2)
    for i in range(5):
        job = new_job(config, [f"n{i}"])
        store.log_path(config, job.id).write_text("x" * 4_000)  # each job ~4.5 KB
        finish(config, job)
    assert store.job_ids(config) == [5, 4]
    assert not store.log_path(config, 3).exists()
    big = new_job(config, ["big"])
    store.log_path(config, big.id).write_text("x" * 50_000)  # alone over the bound
    finish(config, big)
    assert store.job_ids(config) == [6, 5]


def ended_ago(config, job_id: int, seconds: float) -> None:
    """Date the job's record back, as if it had ended `seconds` ago."""
    path = store.job_path(config, job_id)
    then = path.stat().st_mtime - seconds
    os.utime(path, (then, then))


def test_a_long_job_ending_after_newer_ones_is_the_newest_of_the_history(config, monkeypatch):
    """The history keeps the jobs that ended last: a build that ran while newer (larger)
    jobs came and went is not deleted by its own end (its waiter, `job wait`, and the CLI's
    run_here read it right after)."""
    monkeypatch.setattr(store, "MAX_HISTORY_BYTES", 10_000)
    monkeypatch.setattr(store, "MIN_HISTORY", 2)
    build = new_job(config, ["tiny"], kind=JobKind.IMAGE_BUILD)
    for i in range(3):
        job = new_job(config, [f"n{i}"])
        store.log_path(config, job.id).write_text("x" * 4_000)
        finish(config, job)
        ended_ago(config, job.id, 60 - i)
    store.log_path(config, build.id).write_text("x" * 4_000)
    finish(config, build)
    assert store.read(config, build.id).state is JobState.FINISHED
    assert store.job_ids(config) == [4, build.id]


def test_a_prune_cut_short_leaves_no_log_without_its_record(config, monkeypatch):
    """The history is listed by its records: a log whose record went first (the process
    ended between the two) was never deleted, nor counted in the bound."""
    monkeypatch.setattr(store, "MAX_HISTORY", 1)
    unlink = Path.unlink

    def cut_short(path, missing_ok=False):
        unlink(path, missing_ok=missing_ok)
        raise KeyboardInterrupt  # the process ends after the first file

    for i in range(3):
        job = new_job(config, [f"n{i}"])
        store.log_path(config, job.id).write_text("log\n")
        if i == 1:
            monkeypatch.setattr(Path, "unlink", cut_short)
            with pytest.raises(KeyboardInterrupt):
                finish(config, job)
            monkeypatch.setattr(Path, "unlink", unlink)
            store.reap(config)  # its runner (this process) ended it: freed by whoever looks
        else:
            finish(config, job)
    folder = Layout.of(config).jobs
    assert sorted(p.name for p in folder.glob("*.log")) == ["3.log"]
    assert store.job_ids(config) == [3]


def test_a_pruned_job_is_said_to_have_left_the_history(config, monkeypatch):
    """`job show` of a job deleted from the history says so; of an id never given, no job."""
    monkeypatch.setattr(store, "MAX_HISTORY", 1)
    for name in ("n1", "n2"):
        finish(config, new_job(config, [name]))
    with pytest.raises(JobNotFound) as caught:
        jobs.get(config, 1)
    assert str(caught.value) == ("job 1 is no longer kept: the history keeps the last 1 "
                                 "ended jobs, up to 256 MiB of them (the newest 20 whatever "
                                 "their size)")
    with pytest.raises(JobNotFound, match=r"^no job 3 \(the last 1 ended jobs"):
        jobs.get(config, 3)
    build = new_job(config, ["tiny"], kind=JobKind.IMAGE_BUILD)  # job 3, ends after job 4
    finish(config, new_job(config, ["n3"]))
    ended_ago(config, 4, 60)
    finish(config, build)
    assert store.job_ids(config) == [3]
    with pytest.raises(JobNotFound, match="^job 4 is no longer kept"):  # the highest id given
        jobs.get(config, 4)


def test_an_unreadable_index_is_rebuilt_with_the_claims_of_active_jobs(config):
    new_job(config, ["n1"])
    finish(config, new_job(config, ["n2"]))
    (Layout.of(config).jobs / "index.json").write_text("{not json")
    with pytest.raises(Conflict, match="node n1 is busy: job 1"):
        new_job(config, ["n1"])
    assert new_job(config, ["n2"]).id == 3


def test_an_unreadable_record_is_skipped_by_the_list_and_not_found_by_get(config):
    for name in ("n1", "n2"):
        finish(config, new_job(config, [name]))
    store.job_path(config, 1).write_text("garbage")
    with pytest.raises(JobNotFound, match="job 1: its record cannot be read"):
        jobs.get(config, 1)
    assert [j["id"] for j in jobs.list_jobs(config)[0]] == [2]


def test_list_pages_newest_first_with_filters(config):
    for i in range(5):
        job = new_job(config, [f"n{i}"], kind=JobKind.POWER if i % 2 else JobKind.BOOTDEV)
        finish(config, job, JobState.FAILED if i == 3 else JobState.FINISHED)
    page, cursor = jobs.list_jobs(config, limit=2)
    assert [j["id"] for j in page] == [5, 4] and cursor == 4
    page, cursor = jobs.list_jobs(config, limit=2, before=cursor)
    assert [j["id"] for j in page] == [3, 2] and cursor == 2
    page, cursor = jobs.list_jobs(config, limit=2, before=cursor)
    assert [j["id"] for j in page] == [1] and cursor is None
    power, _ = jobs.list_jobs(config, kind=JobKind.POWER)
    assert [j["id"] for j in power] == [4, 2]
    failed, _ = jobs.list_jobs(config, state=JobState.FAILED)
    assert [j["id"] for j in failed] == [4]


def _try_create(state_dir: str, node: str, results) -> None:
    from provisiond.config import load_config

    try:
        job = store.create(load_config(state_dir), JobKind.POWER, [node], {}, "cli:test")
        results.put(("ok", job.id))
    except Conflict:
        results.put(("conflict", None))


def test_concurrent_starts_claim_a_node_once_and_never_share_an_id(config):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_try_create, args=(str(config.state_dir), node, results))
               for node in ["n1"] * 6 + [f"m{i}" for i in range(6)]]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    outcomes = [results.get(timeout=10) for _ in workers]
    ids = [job_id for outcome, job_id in outcomes if outcome == "ok"]
    assert sorted(outcome for outcome, _ in outcomes).count("conflict") == 5
    assert len(ids) == 7 and len(set(ids)) == 7 and sorted(ids) == list(range(1, 8))
