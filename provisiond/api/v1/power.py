"""BMC operations as jobs (operator): power, boot device, firmware update, reprovision.

Each answers 202 with the job (`Location: /api/v1/jobs/ID`); 409 while a named node has a
job running. Results per node come with the job and as `job.progress` events.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from provisiond.api.v1 import Role, route
from provisiond.api.v1.jobs import start_job
from provisiond.jobs.model import (BootdevParams, FirmwareUpdateParams, Job, PowerParams,
                                   ReprovisionParams)
from provisiond.states import JobKind


class Targets(BaseModel):
    names: str = Field(description="a node name or range, e.g. n[01-04]", max_length=1000)


class PowerRequest(Targets, PowerParams):
    pass


class BootdevRequest(Targets, BootdevParams):
    pass


class FirmwareUpdateRequest(Targets, FirmwareUpdateParams):
    pass


class ReprovisionRequest(Targets, ReprovisionParams):
    pass


def _start(kind: JobKind, body: Targets, principal):
    return start_job(kind, [body.names], body.model_dump(mode="json", exclude={"names"}),
                     principal)


@route("/power", "POST", role=Role.OPERATOR, body=PowerRequest, response=Job, status=202,
       summary="Power nodes on, off, soft-off, cycle or reset, or read their power state")
def power(principal, body: PowerRequest, query):
    return _start(JobKind.POWER, body, principal)


@route("/bootdev", "POST", role=Role.OPERATOR, body=BootdevRequest, response=Job, status=202,
       summary="Set the nodes' next boot device (once, or persistent)")
def bootdev(principal, body: BootdevRequest, query):
    return _start(JobKind.BOOTDEV, body, principal)


@route("/firmware/update", "POST", role=Role.OPERATOR, body=FirmwareUpdateRequest,
       response=Job, status=202,
       summary="Have each BMC fetch a firmware image by URL and apply it (Redfish)")
def firmware_update(principal, body: FirmwareUpdateRequest, query):
    return _start(JobKind.FIRMWARE_UPDATE, body, principal)


@route("/reprovision", "POST", role=Role.OPERATOR, body=ReprovisionRequest, response=Job,
       status=202, summary="PXE boot once, power cycle, wait until the nodes report ready")
def reprovision(principal, body: ReprovisionRequest, query):
    return _start(JobKind.REPROVISION, body, principal)
