"""Asynchronous jobs: power, boot device, firmware, reprovision, image and overlay builds.

`start` checks the request (kind, targets, params), records a pending job holding claims on
its targets (409 Conflict naming the job that holds one already) and its audit record, and
starts its runner, a detached process (provisiond.jobs.runner) that calls the library
functions and records per-target results: the API's jobs. `run_here` does the same but runs
the job in the calling process: the CLI's power, bootdev, firmware update and reprovision.
`get`, `wait` and `list_jobs` read the records (the API's job routes and `provisiond job`).
Events: `job.started`, `job.progress` (batches of per-target results), `job.finished`;
builds also `build.started|finished|failed`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NoReturn

from provisiond import audit
from provisiond.config import Config
from provisiond.errors import ExitCode, InvalidInput, ProvisiondError
from provisiond.images.recipe import find_recipe
from provisiond.inventory import load_nodes
from provisiond.jobs import runner, store
from provisiond.jobs.model import Job, OverlayBuildParams, parse_params, split_secret
from provisiond.power.fanout import NodeResult
from provisiond.power.operations import select_nodes
from provisiond.states import JobKind, JobState

__all__ = ["Job", "JobKind", "JobState", "start", "run_here", "get", "wait", "list_jobs"]


def start(config: Config, kind: JobKind | str, names: list[str], params: dict,
          actor: str) -> dict:
    """Record and start a job (the API's way: a runner process of its own); its record
    (with `id`). `names` may hold ranges."""
    job = _create(config, kind, names, params, actor)
    try:
        pid = runner.spawn(config, job.id)
    except (OSError, ValueError) as exc:
        _fail_to_start(config, job, exc)
    store.record_runner(config, job.id, pid)
    return _document(store.read(config, job.id))


def run_here(config: Config, kind: JobKind | str, names: list[str], params: dict,
             actor: str, on_result: Callable[[NodeResult], None] | None = None) -> Job:
    """Record a job as `start` does (checks, claims, audit) and run it to its end in this
    process (the CLI's way: it shows the progress, `on_result` gets each node's result);
    the ended job. The same records and `job.*` events as a started job. Ctrl-C (or
    SIGTERM) ends the job, recorded as interrupted, and then raises KeyboardInterrupt, as
    the command did before it ran as a job (exit 130)."""
    job = _create(config, kind, names, params, actor)
    if runner.run(config, job.id, on_result) == ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    return store.read(config, job.id)


def _create(config: Config, kind: JobKind | str, names: list[str], params: dict,
            actor: str) -> Job:
    """The checked request as a pending job holding its claims, and its audit record."""
    kind = _kind(kind)
    checked = parse_params(kind, params)
    targets = _targets(config, kind, names, checked)
    job = store.create(config, kind, targets, checked.model_dump(mode="json"), actor)
    try:  # the record's params: a URL's credentials are in the job's secret file only
        audit.record(config, actor, f"job.{kind.value}", job.target,
                     {"job": job.id, **job.params})
    except (OSError, ValueError) as exc:
        _fail_to_start(config, job, exc)
    return job


def _fail_to_start(config: Config, job: Job, exc: Exception) -> NoReturn:
    job.state, job.message = JobState.FAILED, f"cannot start: {exc}"
    store.finish(config, job)
    raise ProvisiondError(f"job {job.id}: {job.message}") from None


def get(config: Config, job_id: int) -> dict:
    """A job's record; JobNotFound if there is none (or it left the history)."""
    return _document(store.get(config, job_id))


def wait(config: Config, job_id: int, timeout: float, poll: float = 0.5) -> dict:
    """The job's record once it has ended; a ProvisiondError if it runs `timeout` s on."""
    if not 0 < timeout < math.inf:  # nan: never a deadline, and a busy loop (sleeps of 0 s)
        raise InvalidInput(f"timeout: {timeout:g} is not a number of seconds above 0",
                           field="timeout")
    deadline = time.monotonic() + timeout
    while True:
        job = store.get(config, job_id)
        if not job.active:
            return _document(job)
        if time.monotonic() >= deadline:
            raise ProvisiondError(f"job {job_id} ({job.kind.value} {job.target}) is still "
                                  f"{job.state.value} after {timeout:g} s")
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


def list_jobs(config: Config, limit: int = 100, before: int | None = None,
              kind: JobKind | None = None, state: JobState | None = None
              ) -> tuple[list[dict], int | None]:
    """Jobs newest first, those with an id below `before` (the previous page's cursor),
    optionally of one kind or state; and the cursor of the next page (None at the end)."""
    items: list[dict] = []
    for job_id in store.job_ids(config):
        if before is not None and job_id >= before:
            continue
        if len(items) == limit:
            return items, items[-1]["id"]
        try:
            job = store.get(config, job_id)
        except ProvisiondError:
            continue  # pruned meanwhile, or unreadable (logged)
        if (kind is None or job.kind is kind) and (state is None or job.state is state):
            items.append(_document(job))
    return items, None


def _document(job: Job) -> dict:
    """The job as the API and `provisiond job` show it: its params as the audit record
    has them (a URL without its user and password, also in the record of an active job
    an older release started, whose runner reads it whole)."""
    return {**job.model_dump(mode="json"), "params": split_secret(job.params)[0]}


def _kind(kind: JobKind | str) -> JobKind:
    try:
        return JobKind(kind)
    except ValueError:
        raise InvalidInput(f"no job kind {kind!r} (one of: "
                           f"{', '.join(k.value for k in JobKind)})") from None


def _targets(config: Config, kind: JobKind, names: list[str], params) -> list[str]:
    """The job's targets, checked: nodes that exist, or one image with a recipe."""
    if kind is JobKind.IMAGE_BUILD:
        if len(names) != 1:
            raise InvalidInput("an image build names one image")
        find_recipe(config, names[0])  # RecipeNotFound, or InvalidInput for a bad name
        return list(names)
    if isinstance(params, OverlayBuildParams) and params.all:
        if names:
            raise InvalidInput("name nodes or ask for all, not both")
        return list(load_nodes(config))
    if not names:
        raise InvalidInput("name at least one node")
    return list(select_nodes(config, ",".join(names)))
