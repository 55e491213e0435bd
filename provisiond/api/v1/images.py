"""`/api/v1/images`: built images (readers), deleted by admins. Builds are jobs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Page, Role, config, reply, route
from provisiond.images.manifests import OLD_NAME_RE
from provisiond.service import images


class Blob(BaseModel):
    model_config = ConfigDict(extra="allow")

    digest: str
    size: int


class Layer(Blob):
    kind: str
    description: str | None = None


class Kernel(Blob):
    version: str


class Image(BaseModel):
    """An image's manifest: its kernel and layers (blobs), how to boot it, its recipe."""

    model_config = ConfigDict(extra="allow")

    name: str
    kernel: Kernel
    layers: list[Layer]
    kernel_args: list[str]
    init: str
    built_at: str
    build_seconds: float
    total_size: int
    generation: str = Field("", description="made at the image's first build (and by "
                            "`image import --force`), kept by every rebuild; empty for "
                            "an image built before generations")


class ImageName(BaseModel):
    name: str = Field(pattern=f"^{OLD_NAME_RE.pattern}$",
                      description="a DNS label (or the name of a build of an older rule)")


class DeleteQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = Field(False, description="delete even while nodes use it")


@route("/images", "GET", role=Role.READER, summary="Built images", response=Page[Image])
def list_images(principal, body, query):
    return {"items": images.list_images(config()), "continue": None}


@route("/images/<name>", "GET", role=Role.READER, summary="An image's manifest",
       response=Image, path=ImageName)
def show_image(principal, body, query, name: str):
    return images.show_image(config(), name)


@route("/images/<name>", "DELETE", role=Role.ADMIN, query=DeleteQuery, status=204,
       path=ImageName,
       summary="Delete an image (409 while nodes use it, unless force); gc frees blobs")
def delete_image(principal, body, query: DeleteQuery, name: str):
    images.delete_image(config(), principal.actor, name, force=query.force)
