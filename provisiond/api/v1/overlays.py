"""`/api/v1/overlays`: overlays on the search path, their files, and one file rendered for
one node with secrets as placeholders (readers). Builds are jobs."""

from __future__ import annotations

from flask import Response
from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Name, Page, Role, config, route
from provisiond.inventory.values import OVERLAY_RE
from provisiond.service import overlays


class Overlay(BaseModel):
    name: str
    path: str
    shadows: list[str]
    files: int | None = Field(description="null when the overlay cannot be read (`error`)")
    templates: int | None
    kind: str | None = Field(description="'runtime only' when it holds secrets, else 'any'; "
                             "null when the overlay cannot be read")
    description: str | None
    error: str | None = Field(description="why the overlay cannot be read (its overlay.yaml, "
                              "a template, a file name), in one line; null when it can")


class OverlayFile(BaseModel):
    path: str
    kind: str
    mode: str
    source: str


class OverlayDetail(BaseModel):
    name: str
    path: str
    shadows: list[str]
    secret: bool
    variables: list[str]
    description: str | None
    files: list[OverlayFile]


class RenderQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: Name
    path: str = Field(description="the file's path on the node, e.g. /etc/hosts",
                      max_length=4096)


class OverlayName(BaseModel):
    name: str = Field(pattern=f"^{OVERLAY_RE.pattern}$", max_length=255)


@route("/overlays", "GET", role=Role.READER, summary="Overlays on the search path (one that "
       "cannot be read is listed with its `error`)", response=Page[Overlay])
def list_overlays(principal, body, query):
    return {"items": overlays.list_overlays(config()), "continue": None}


@route("/overlays/<name>", "GET", role=Role.READER, summary="An overlay's files",
       response=OverlayDetail, path=OverlayName)
def show_overlay(principal, body, query, name: str):
    return overlays.show_overlay(config(), name)


@route("/overlays/<name>/render", "GET", role=Role.READER, query=RenderQuery,
       summary="One file of the overlay as rendered for a node (secrets as placeholders)",
       produces="application/octet-stream", path=OverlayName)
def render_file(principal, body, query: RenderQuery, name: str):
    data = overlays.render_file(config(), query.node, name, query.path)
    return Response(data, content_type="application/octet-stream")
