"""`/api/v1/jobs`: asynchronous jobs (power, boot device, firmware, reprovision, builds),
started by the operator routes of power.py and builds.py, read here."""

from __future__ import annotations

from flask import Response
from pydantic import BaseModel, ConfigDict, Field

from provisiond import jobs
from provisiond.api.v1 import PREFIX, Page, Role, SeqCursor, config, reply, route
from provisiond.errors import JobNotFound
from provisiond.jobs.model import Job
from provisiond.service.inventory import DEFAULT_LIMIT, MAX_LIMIT, decode_cursor, encode_cursor
from provisiond.states import JobKind, JobState


class JobsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: SeqCursor | None = Field(None, alias="continue")
    kind: JobKind | None = None
    state: JobState | None = None


@route("/jobs", "GET", role=Role.READER, summary="Jobs, newest first", query=JobsQuery,
       response=Page[Job])
def list_jobs(principal, body, query: JobsQuery):
    found, cursor = jobs.list_jobs(config(), query.limit, decode_cursor(query.continue_, int),
                                   query.kind, query.state)
    return {"items": found, "continue": None if cursor is None else encode_cursor(cursor)}


@route("/jobs/<job_id>", "GET", role=Role.READER, response=Job,
       summary="One job: its state and a result per target (node, or image)")
def get_job(principal, body, query, job_id: str):
    if not (job_id.isascii() and job_id.isdigit()) or len(job_id) > 18:
        raise JobNotFound(f"no job {job_id[:30]!r}: job ids are numbers")
    return jobs.get(config(), int(job_id))


def start_job(kind: JobKind, names: list[str], params: dict, principal) -> Response:
    """Start a job for an operator route: 202, the job, and its Location."""
    job = jobs.start(config(), kind, names, params, principal.actor)
    return reply(job, status=202, headers={"Location": f"{PREFIX}/jobs/{job['id']}"})


