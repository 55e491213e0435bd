"""Job records under `<state>/jobs/`, their claims on targets, and a bounded history.

```
jobs/index.json   {"next_id": N, "active": {"<id>": ["node/n01", ...]}}: the claims
jobs/<id>.json    the Job record (provisiond.jobs.model.Job)
jobs/<id>.log     the runner's stdout and stderr
jobs/<id>.secret  0600: the params the record holds without their credentials (a firmware
                  URL's user and password, its query), whole; removed when the job ends
jobs/.lock        held while the index changes or a record changes hands
```

A job claims its targets (`node/NAME` for BMC jobs, `image/NAME`, `overlays/NAME`) while it
is pending or running and its runner lives. A runner is known by its pid and its process
start time, so a reused pid is not taken for it; a job whose runner has not yet been
recorded holds its claims SPAWN_GRACE seconds. Whoever looks next (a new job, a get, a list)
marks a job whose runner died failed and frees its claims: a crash holds nothing forever.
The history keeps the jobs that ended last (by their records' last write), within
MAX_HISTORY and MAX_HISTORY_BYTES; deleting one takes its log first, then its record.

A record is readable by every local user who can reach the state directory, so no secret is
in it: a URL's user, password and query go to the job's `.secret` file (0600, written before the
record, removed as the job ends; one whose job is not active, left by a crash or a record
deleted by hand, by the next writer). Records an older release wrote with them are rewritten
without them by the first writer that finds them (once; an active one once it ended).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.errors import Conflict, JobNotFound, ProvisiondError
from provisiond.inventory.ranges import names_text
from provisiond.jobs.model import POWER_STATUS, Job, split_secret
from provisiond.state.layout import Layout
from provisiond.states import JobKind, JobState

log = logging.getLogger("provisiond.jobs")
MAX_HISTORY = 1000  # finished jobs kept (records and logs); older ones are deleted
# ... and at most this many bytes of them, the newest MIN_HISTORY kept whatever their size:
# a `power status` of 10,000 nodes is a ~700 KB record, so 1,000 of them were ~700 MB
MAX_HISTORY_BYTES = 256 << 20
MIN_HISTORY = 20
SPAWN_GRACE = 60.0  # seconds a job may wait for its runner to record itself
CLAIM_PREFIX = {JobKind.IMAGE_BUILD: "image", JobKind.OVERLAY_BUILD: "overlays"}
CLAIM_WORDS = {"node": "node {}", "image": "image {}", "overlays": "the overlays of node {}"}


class Index(BaseModel):
    next_id: int = 1
    active: dict[int, list[str]] = {}
    no_legacy_secrets: bool = False
    """No record holds a URL's credentials any more (see _take_out_legacy_secrets)."""


def job_path(config: Config, job_id: int) -> Path:
    return Layout.of(config).job(str(job_id))


def log_path(config: Config, job_id: int) -> Path:
    return Layout.of(config).job_log(str(job_id))


def secret_path(config: Config, job_id: int) -> Path:
    return Layout.of(config).job_secret(str(job_id))


def claims_of(kind: JobKind, names: list[str], params: dict) -> list[str]:
    """What a job holds while it runs: none for `power status`, which only reads (it is
    not refused during a node's reprovision, nor refuses one)."""
    if kind is JobKind.POWER and params.get("action") == POWER_STATUS:
        return []
    prefix = CLAIM_PREFIX.get(kind, "node")
    return [f"{prefix}/{name}" for name in names]


def create(config: Config, kind: JobKind, names: list[str], params: dict, actor: str) -> Job:
    """A new pending job holding claims on `names`; Conflict if one is claimed already.
    A URL's credentials in `params` go to the job's secret file, not to its record."""
    wanted = claims_of(kind, names, params)
    params, secret = split_secret(params)
    with _locked(config):
        index = _read_index(config)
        _reap(config, index)
        _check_free(config, index, wanted)
        job = Job(id=index.next_id, kind=kind, target=_target(kind, names), names=names,
                  params=params, secret_params=sorted(secret), actor=actor,
                  state=JobState.PENDING, created=time.time())
        index.next_id += 1
        index.active[job.id] = wanted
        try:
            if secret:
                write_atomic(secret_path(config, job.id), json.dumps(secret), mode=0o600)
            save(config, job, durable=True)
            _prune(config, index)
            _write_index(config, index)
        except BaseException:
            # no index holds it (a full disk): no runner starts, no reaper would see it
            for path in (secret_path(config, job.id), job_path(config, job.id)):
                path.unlink(missing_ok=True)
            raise
    return job


def params_of(config: Config, job: Job) -> dict:
    """The job's params whole: its record's, with those its secret file holds (the runner's
    view; never stored in a record, nor shown)."""
    if not job.secret_params:
        return dict(job.params)
    path = secret_path(config, job.id)
    try:
        secret = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ProvisiondError(f"job {job.id}: the credentials of its "
                              f"{', '.join(job.secret_params)} cannot be read from {path}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    return {**job.params, **{key: secret[key] for key in job.secret_params if key in secret}}


def _forget_secret(config: Config, job_id: int) -> None:
    secret_path(config, job_id).unlink(missing_ok=True)


def record_runner(config: Config, job_id: int, pid: int) -> None:
    """Note the runner's pid (once) so that its death frees the job's claims."""
    with _locked(config):
        job = read(config, job_id)
        if job.active and job.runner_pid is None:
            job.runner_pid, job.runner_start = pid, process_start(pid)
            save(config, job, durable=False)


def begin(config: Config, job_id: int, pid: int) -> Job | None:
    """Mark the job running in runner `pid`; None if it is not pending (or another runner's)."""
    with _locked(config):
        job = read(config, job_id)
        if job.state is not JobState.PENDING or job.runner_pid not in (None, pid):
            return None
        job.state, job.started = JobState.RUNNING, time.time()
        job.runner_pid, job.runner_start = pid, process_start(pid)
        save(config, job, durable=True)
    return job


def finish(config: Config, job: Job) -> None:
    """Store the ended job and free its claims."""
    with _locked(config):
        save(config, job, durable=True)
        _forget_secret(config, job.id)
        index = _read_index(config)
        index.active.pop(job.id, None)
        _prune(config, index)
        _write_index(config, index)


def save(config: Config, job: Job, durable: bool = False) -> None:
    write_atomic(job_path(config, job.id), job.model_dump_json(), durable=durable)


def read(config: Config, job_id: int) -> Job:
    try:
        return Job.model_validate_json(job_path(config, job_id).read_bytes())
    except FileNotFoundError:
        raise _not_found(config, job_id) from None
    except (OSError, ValidationError) as exc:
        log.warning("job %s: unreadable record: %s", job_id, exc)
        raise JobNotFound(f"job {job_id}: its record cannot be read") from None


def _not_found(config: Config, job_id: int) -> JobNotFound:
    """A job deleted from the history said apart from an id never given (ids are given in
    order and never reused: below the index's next id, or a stored one's)."""
    try:
        next_id = Index.model_validate_json(Layout.of(config).jobs_index.read_bytes()).next_id
    except (OSError, ValidationError):
        next_id = 1
    if 0 < job_id < max(next_id, max(job_ids(config), default=0)):
        return JobNotFound(f"job {job_id} is no longer kept: the history keeps the last "
                           f"{MAX_HISTORY} ended jobs, up to {MAX_HISTORY_BYTES >> 20} MiB of "
                           f"them (the newest {MIN_HISTORY} whatever their size)")
    return JobNotFound(f"no job {job_id} (the last {MAX_HISTORY} ended jobs are kept, up "
                       f"to {MAX_HISTORY_BYTES >> 20} MiB of them)")


def get(config: Config, job_id: int) -> Job:
    """The job as it stands; one whose runner died is failed first."""
    job = read(config, job_id)
    if job.active and not runner_alive(job):
        reap(config)
        job = read(config, job_id)
    return job


def job_ids(config: Config) -> list[int]:
    """Ids of the stored jobs, newest first."""
    folder = Layout.of(config).jobs
    if not folder.is_dir():
        return []
    return sorted((int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()),
                  reverse=True)


def reap(config: Config) -> None:
    with _locked(config):
        index = _read_index(config)
        _reap(config, index)
        _write_index(config, index)


def runner_alive(job: Job, now: float | None = None) -> bool:
    if job.runner_pid is None:
        return (now or time.time()) - job.created < SPAWN_GRACE
    started = process_start(job.runner_pid)
    return started is not None and started == job.runner_start


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot); None if it is gone or a
    zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name may hold blanks and ')'
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _target(kind: JobKind, names: list[str]) -> str:
    """The targets as one range, bounded: events, audit records and messages show it."""
    return names[0] if kind is JobKind.IMAGE_BUILD else names_text(names, "node")


def _check_free(config: Config, index: Index, wanted: list[str]) -> None:
    held = {claim: job_id for job_id, claims in index.active.items() for claim in claims}
    for claim in wanted:
        if claim in held:
            other = read(config, held[claim])
            what, name = claim.split("/", 1)
            raise Conflict(f"{CLAIM_WORDS[what].format(name)} is busy: job {other.id} "
                           f"({other.kind.value} {other.target}, by {other.actor}) is "
                           f"{other.state.value}")


def _reap(config: Config, index: Index) -> None:
    """Fail the active jobs whose runner is gone; drop their claims."""
    now = time.time()
    for job_id in list(index.active):
        try:
            job = read(config, job_id)
        except JobNotFound:
            del index.active[job_id]
            continue
        if job.active and runner_alive(job, now):
            continue
        if job.active:
            job.state, job.finished = JobState.FAILED, now
            job.message = (f"the job's runner (pid {job.runner_pid}) ended without finishing "
                           f"it; see {log_path(config, job_id)}" if job.runner_pid else
                           f"no runner started within {SPAWN_GRACE:g} s")
            save(config, job, durable=True)
            log.warning("job %s failed: %s", job_id, job.message)
        _forget_secret(config, job_id)
        del index.active[job_id]


def _prune(config: Config, index: Index) -> None:
    """Delete the records and logs of the ended jobs past the newest MAX_HISTORY, or past
    MAX_HISTORY_BYTES of them (the newest MIN_HISTORY always stay)."""
    kept_bytes = 0
    for position, (job_id, record) in enumerate(_ended_last_first(config, index)):
        kept_bytes += record.st_size + _size(log_path(config, job_id))
        if position >= MAX_HISTORY or (position >= MIN_HISTORY and
                                       kept_bytes > MAX_HISTORY_BYTES):
            for path in (log_path(config, job_id), job_path(config, job_id)):
                path.unlink(missing_ok=True)  # the log first: the records list the history
    _forget_stray_secrets(config, index)


def _forget_stray_secrets(config: Config, index: Index) -> None:
    """Remove the secret files of the jobs that are not active: an ended job's whose removal
    a crash stopped, or one whose record went (by hand) while it was active. A job the
    index lacks but whose record is active and runner alive keeps its own."""
    for path in Layout.of(config).jobs.glob("*.secret"):
        if not path.stem.isdigit() or int(path.stem) in index.active:
            continue
        with contextlib.suppress(JobNotFound):
            job = read(config, int(path.stem))
            if job.active and runner_alive(job):
                continue
        path.unlink(missing_ok=True)


def _ended_last_first(config: Config, index: Index) -> list[tuple[int, os.stat_result]]:
    """The ended jobs and their records' stat, the one that ended last first (its record's
    last write, then its id): the newest are those that ended last, not those created last,
    or a build that ran while newer jobs came and went was deleted by its own end."""
    ended = []
    for job_id in (i for i in job_ids(config) if i not in index.active):
        with contextlib.suppress(OSError):  # deleted meanwhile (by hand: the lock is ours)
            ended.append((job_id, job_path(config, job_id).stat()))
    return sorted(ended, key=lambda item: (item[1].st_mtime_ns, item[0]), reverse=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_index(config: Config) -> Index:
    """The index; an unreadable one is rebuilt from the records (never reusing an id)."""
    path = Layout.of(config).jobs_index
    try:
        index = Index.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        index = Index()
    except (OSError, ValidationError) as exc:
        log.warning("%s: unreadable, rebuilt from the job records: %s", path, exc)
        index = _rebuilt_index(config)
    ids = job_ids(config)
    index.next_id = max(index.next_id, ids[0] + 1 if ids else 1)
    if not index.no_legacy_secrets:
        index.no_legacy_secrets = _take_out_legacy_secrets(config, ids)
    return index


def _take_out_legacy_secrets(config: Config, ids: list[int]) -> bool:
    """Rewrite the ended records an older release wrote with a URL's user and password
    in them (0644: readable by every local user) without those, their last-write time kept
    (the history's order); True if none is left. An active one is its runner's: left to be
    done once it ended."""
    left = False
    for job_id in ids:
        path = job_path(config, job_id)
        try:
            before = path.stat()
            data = path.read_bytes()
        except OSError:
            continue
        if b"@" not in data and b"?" not in data:  # the quick look: no userinfo, no query
            continue
        try:
            job = Job.model_validate_json(data)
        except ValidationError:
            continue
        params, secret = split_secret(job.params)
        if not secret:
            continue
        if job.active:
            left = True
            continue
        job.params = params
        save(config, job, durable=True)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        log.warning("job %s: took the credentials of its %s out of its record %s", job_id,
                    ", ".join(sorted(secret)), path)
    return not left


def _rebuilt_index(config: Config) -> Index:
    index = Index()
    for job_id in job_ids(config):
        with contextlib.suppress(JobNotFound):
            job = read(config, job_id)
            if job.active:
                index.active[job_id] = claims_of(job.kind, job.names, job.params)
    return index


def _write_index(config: Config, index: Index) -> None:
    write_atomic(Layout.of(config).jobs_index, index.model_dump_json(), durable=True)


@contextlib.contextmanager
def _locked(config: Config) -> Iterator[None]:
    with locked(Layout.of(config).jobs_lock):
        yield
