"""Image and overlay builds as jobs (operator): 202 with the job and its Location; 409
while the same image (or a named node's overlays) is being built."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Role, route
from provisiond.api.v1.jobs import start_job
from provisiond.jobs.model import ImageBuildParams, Job
from provisiond.states import JobKind


class ImageBuildQuery(ImageBuildParams):
    pass


class OverlayBuildQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: str | None = Field(None, max_length=1000,
                              description="a node name or range; default: every node")


@route("/images/<name>/build", "POST", role=Role.OPERATOR, query=ImageBuildQuery, response=Job,
       status=202, summary="Build an image from its recipe (cached layers); needs a root server")
def build_image(principal, body, query: ImageBuildQuery, name: str):
    return start_job(JobKind.IMAGE_BUILD, [name], query.model_dump(mode="json"), principal)


@route("/overlays/build", "POST", role=Role.OPERATOR, query=OverlayBuildQuery, response=Job,
       status=202, summary="Build nodes' overlays (only what changed)")
def build_overlays(principal, body, query: OverlayBuildQuery):
    names = [query.names] if query.names else []
    return start_job(JobKind.OVERLAY_BUILD, names, {"all": not names}, principal)
