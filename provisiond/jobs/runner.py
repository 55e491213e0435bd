"""A job's runner: a process of its own, started detached from whoever asked for the job.

The HTTP server never runs a job itself: its worker is gevent's, and pyghmi and sushy start
real threads and block on sockets of their own, which must not meet gevent's patched ones;
and a job outlives the request (and a restarted worker). `spawn` starts
`python -m provisiond.jobs run ID` in a new session (a signal to the server's process group
does not reach it), its stdout and stderr going to the job's log.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from provisiond.config import Config
from provisiond.errors import ExitCode, ProvisiondError
from provisiond.images.build import interrupt_on_term
from provisiond.jobs import store
from provisiond.jobs.model import Job, JobResult
from provisiond.events import emit
from provisiond.jobs.work import Progress, execute, job_subject
from provisiond.power.fanout import NodeResult
from provisiond.states import JobState

log = logging.getLogger("provisiond.jobs")


def spawn(config: Config, job_id: int) -> int:
    """Start the runner of job `job_id`; its pid. The child is waited for in the background
    (a greenlet under gevent, else a thread) so that it never lingers as a zombie."""
    command = [sys.executable, "-m", "provisiond.jobs", "run", "--state-dir",
               str(config.state_dir), str(job_id)]
    with open(store.log_path(config, job_id), "ab") as output:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    threading.Thread(target=child.wait, name=f"job-{job_id}", daemon=True).start()
    return child.pid


def run(config: Config, job_id: int,
        on_result: Callable[[NodeResult], None] | None = None) -> int:
    """Run a pending job to its end in this process; 0, 1 if the job was not pending, 130
    (ExitCode.INTERRUPTED) if SIGTERM or Ctrl-C ended it (its record says so).
    `on_result` gets each node's result as it comes (the CLI's progress bar)."""
    job = store.begin(config, job_id, os.getpid())
    if job is None:
        log.error("job %s is not pending (or has another runner): nothing to do", job_id)
        return 1
    log.info("job %s: %s %s for %s", job.id, job.kind.value, job.target, job.actor)
    emit(config, "job.started", job_subject(job), _summary(job))
    progress = Progress(config, job, on_result)
    results, message, code = [], None, 0
    try:
        with interrupt_on_term():
            results = execute(config, job, progress)
    except ProvisiondError as exc:
        message = str(exc)
    except KeyboardInterrupt:
        message, code = "interrupted (SIGTERM, or Ctrl-C in the CLI)", ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a bug fails the job, never leaves it running
        log.exception("job %s", job.id)
        message = f"internal error: {type(exc).__name__}: {exc}"
    progress.flush()
    _end(config, job, results or job.results, message)
    return code


def _end(config: Config, job: Job, results: list[JobResult], message: str | None) -> None:
    """Store the outcome: one result per target, in target order; finished if all are ok."""
    by_name = {r.name: r for r in results}
    missing = message or "not done"
    job.results = [by_name.get(name) or JobResult(name=name, result="error", detail=missing)
                   for name in job.names]
    failed = [r for r in job.results if r.result == "error"]
    if failed and message is None:
        message = f"{len(failed)} of {len(job.results)} failed; {failed[0].name}: " \
                  f"{failed[0].detail}"
    job.state = JobState.FAILED if failed or message else JobState.FINISHED
    job.message, job.finished = message, time.time()
    store.finish(config, job)
    log.info("job %s %s%s", job.id, job.state.value, f": {message}" if message else "")
    emit(config, "job.finished", job_subject(job), {**_summary(job), "message": message,
                                                    "ok": len(job.results) - len(failed),
                                                    "error": len(failed)})


def _summary(job: Job) -> dict:
    return {"job": job.id, "kind": job.kind.value, "target": job.target,
            "count": len(job.names), "actor": job.actor, "state": job.state.value}

