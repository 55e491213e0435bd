"""The OpenAPI 3.1 document, generated from the registered routes and the JSON schemas of
their pydantic models (never written by hand), and a page that renders it for people."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from flask import Response
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from provisiond import __version__
from provisiond.api.v1 import OPERATIONS, PREFIX, Operation, bp, reply, route
from provisiond.api.v1.formats import FormatsSchema

PAGE = Path(__file__).with_name("docs.html")
_PARAM_RE = re.compile(r"<(?:[a-z]+:)?([A-Za-z_][A-Za-z0-9_]*)>")
REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    code: str = Field(description="a short stable slug: not_found, invalid_input, "
                                  "unauthenticated, forbidden, precondition_failed...")
    message: str = Field(description="one line for people")
    field: str | None = Field(description="the input field at fault, dotted, if one is")


class ErrorAnswer(BaseModel):
    """Every error answer of the server has this shape."""

    error: ErrorDetail


@route("/openapi.json", "GET", role=None, summary="This API's OpenAPI 3.1 document",
       tags=("docs",))
def openapi(principal, body, query):
    return reply(openapi_document())


@bp.get("/docs")
def docs():
    """A page for people, rendering the document (not an API operation itself)."""
    return Response(PAGE.read_text(), content_type="text/html; charset=utf-8")


@functools.cache
def openapi_document() -> dict:
    """The document for every registered operation (the set is fixed once the app is made)."""
    refs, schema = models_json_schema(_models(OPERATIONS), ref_template=REF,
                                      schema_generator=FormatsSchema)
    schemas = schema.get("$defs", {})
    paths: dict[str, dict] = {}
    for op in OPERATIONS:
        path = PREFIX + _PARAM_RE.sub(r"{\1}", op.rule)
        paths.setdefault(path, {})[op.method.lower()] = _operation(op, refs, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "provisiond API", "version": __version__,
                 "description": "Inventory, status, images, overlays, jobs and events of a "
                                "provisiond server. Bearer tokens: `provisiond token create`."},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "a token from `provisiond token create`"}}},
    }


def _models(operations: list[Operation]) -> list[tuple[type[BaseModel], str]]:
    found = {(ErrorAnswer, "serialization")}
    for op in operations:
        found |= {(op.body, "validation"), (op.query, "validation"), (op.path, "validation"),
                  (op.response, "serialization")}
    return sorted(((m, mode) for m, mode in found if m is not None),
                  key=lambda pair: (pair[0].__module__, pair[0].__qualname__, pair[1]))


def _operation(op: Operation, refs: dict, schemas: dict) -> dict:
    item = {"operationId": op.endpoint, "summary": op.summary, "tags": list(op.tags),
            "parameters": _path_parameters(op, refs, schemas) + _query_parameters(
                op, refs, schemas),
            "responses": _responses(op, refs),
            "security": [{"bearer": []}] if op.role else [],
            "x-provisiond-role": op.role.label if op.role else None}
    if op.description:
        item["description"] = op.description
    if op.body:
        schema = refs[(op.body, "validation")]
        types = ("application/merge-patch+json", "application/json") \
            if op.method == "PATCH" else ("application/json",)
        types += ("application/x-www-form-urlencoded",) if op.forms else ()
        item["requestBody"] = {"required": True,
                               "content": {t: {"schema": schema} for t in types}}
    return item


def _path_parameters(op: Operation, refs: dict, schemas: dict) -> list[dict]:
    """The rule's parameters, each with its field's schema in `op.path` (any string
    without one)."""
    fields = _properties(op.path, refs, schemas)[0] if op.path else {}
    return [{"name": name, "in": "path", "required": True,
             "schema": _schema(fields.get(name, {"type": "string"}))}
            for name in _PARAM_RE.findall(op.rule)]


def _query_parameters(op: Operation, refs: dict, schemas: dict) -> list[dict]:
    if not op.query:
        return []
    properties, required = _properties(op.query, refs, schemas)
    return [{"name": name, "in": "query", "required": name in required,
             "schema": _schema(prop),
             **({"description": prop["description"]} if "description" in prop else {})}
            for name, prop in properties.items()]


def _properties(model: type[BaseModel], refs: dict, schemas: dict) -> tuple[dict, set]:
    """A parameter model's properties and the names of the required ones."""
    found = schemas[refs[(model, "validation")]["$ref"].rsplit("/", 1)[1]]
    return found.get("properties", {}), set(found.get("required", []))


def _schema(prop: dict) -> dict:
    return {k: v for k, v in prop.items() if k != "title"}


def _responses(op: Operation, refs: dict) -> dict:
    error = {"description": "an error", "content": {"application/json": {
        "schema": refs[(ErrorAnswer, "serialization")]}}}
    if op.status == 204:
        answers = {"204": {"description": "done"}}
    else:
        schema = refs[(op.response, "serialization")] if op.response else {}
        answer = {"description": op.summary, "content": {op.produces: {"schema": schema}}}
        answers = {str(status): answer for status in (op.status, *op.also)}
    codes = ["400", "404", "405", "414", "431"]  # 414, 431: gunicorn's, before the app
    if op.role:
        codes += ["401", "403"]
    if op.body:
        codes += ["413", "415", "422"]
    if op.method in ("POST", "PUT", "PATCH", "DELETE"):
        codes += ["409"]
    if op.method in ("PUT", "PATCH", "DELETE"):
        codes += ["412"]
    codes += [str(code) for code in op.errors]
    answers.update({code: error for code in sorted(codes)})
    return answers
