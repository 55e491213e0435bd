"""The `/api/v1` framework: `route` puts a view in the blueprint and in the OpenAPI document.

A view declares who may call it (a Role, or None for a route open to nodes) and the pydantic
models of its query, body and answer. The wrapper authenticates the bearer token, parses and
validates the query and the body (unknown fields, wrong types, malformed or oversize JSON:
InvalidInput, 400/413, before the view runs) and calls the view with `principal=`, `body=`
and `query=`. What the view returns (a model, a dict, a list, None, or a Response from
`reply`) becomes the JSON answer. Each module of this package holds the views of one
resource and is imported by `blueprint()`.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import time
import pkgutil
import re
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

from flask import Blueprint, Response, current_app, jsonify, request
from pydantic import BaseModel, Field, StringConstraints, ValidationError

from provisiond.auth import Principal, Role, TokenRefused, TokenStore
from provisiond.config import LABEL_RE, Config
from provisiond.errors import (Forbidden, InvalidInput, ProvisiondError, TooLarge,
                               Unauthenticated, UnsupportedMediaType)
from provisiond.inventory.store import describe_validation_error
from provisiond.service import journal

__all__ = ["bp", "route", "reply", "config", "if_match", "Page", "Role",
           "Principal", "OPERATIONS", "blueprint", "node_endpoints", "Name", "NodeRange",
           "NameCursor", "SeqCursor"]

log = logging.getLogger("provisiond.api")
PREFIX = "/api/v1"
bp = Blueprint("api_v1", __name__, url_prefix=PREFIX)
JSON_TYPES = ("application/json", "application/merge-patch+json")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
_ETAG_RE = re.compile(r'\s*(W/)?"([^"]*)"\s*(,|$)')

# What the API takes, declared once so that the OpenAPI document says it (a value of the
# right type that the API would refuse makes the document lie) and pydantic checks it.
Name = Annotated[str, StringConstraints(pattern=f"^{LABEL_RE.pattern}$")]
"""A node, profile or token name: a DNS label."""
# The characters of a range, not its grammar: a regular expression of the grammar made
# schemathesis take 7 minutes to make examples of one operation. The grammar is NodeSet's.
NodeRange = Annotated[str, StringConstraints(pattern=r"^[a-z0-9\[\],!&^/-]+$",
                                             max_length=1000)]
"""A node name or range (n[001-064], a[1-4],b[1-2]; ! & ^ as ClusterShell's NodeSet)."""
NameCursor = Annotated[str, Field(pattern=f"^{LABEL_RE.pattern}$",
                                  description="the `continue` of the previous page")]
SeqCursor = Annotated[str, Field(pattern="^[0-9]{1,18}$",
                                 description="the `continue` of the previous page")]


@dataclass(frozen=True)
class Operation:
    """One registered view: what the OpenAPI document says of it, and what the wrapper
    checks before it runs."""

    rule: str
    method: str
    endpoint: str
    role: Role | None
    summary: str
    description: str
    body: type[BaseModel] | None
    query: type[BaseModel] | None
    response: type[BaseModel] | None
    path: type[BaseModel] | None
    status: int
    tags: tuple[str, ...]
    produces: str = "application/json"
    also: tuple[int, ...] = ()
    forms: bool = False
    errors: tuple[int, ...] = ()
    nodes: bool = False


OPERATIONS: list[Operation] = []
Item = TypeVar("Item")


class Page(BaseModel, Generic[Item]):
    """One page of a list: pass `continue` back to get the next; null: this is the last."""

    items: list[Item]
    continue_: str | None = Field(None, alias="continue",
                                  description="give it as ?continue= for the next page")


def route(rule: str, method: str, *, role: Role | None, summary: str,
          body: type[BaseModel] | None = None, query: type[BaseModel] | None = None,
          response: type[BaseModel] | None = None, status: int = 200, tags=(),
          operation_id: str | None = None, produces: str = "application/json",
          also: tuple[int, ...] = (), forms: bool = False, errors: tuple[int, ...] = (),
          nodes: bool = False, path: type[BaseModel] | None = None):
    """Register the decorated view at `PREFIX + rule` for `method` (see the module doc).
    The operation id is MODULE_FUNCTION unless given (views made by a factory); `produces`
    is the media type of a view answering other than JSON (with its own Response); `also`
    other success statuses it may answer (a PUT that creates: 201); `forms`: the body may
    also come as an HTML form (the node agent's reports); `errors` error statuses beyond
    those every operation of its kind may answer (503 of a bounded stream); `nodes`: nodes
    call it while they boot, so the boot listener answers it (provisiond.api.listeners);
    `path` a model of the rule's parameters (a field per <name>; without it each is any
    string)."""

    def decorate(view):
        module = view.__module__.rsplit(".", 1)[-1]
        endpoint = operation_id or f"{module}_{view.__name__}"
        op = Operation(rule, method.upper(), endpoint, role, summary,
                       (view.__doc__ or "").strip(), body, query, response, path, status,
                       tuple(tags) or (module,), produces, tuple(also), forms, tuple(errors),
                       nodes)

        @functools.wraps(view)
        def wrapper(**path_args):
            return _handle(op, view, path_args)

        bp.add_url_rule(rule, endpoint=op.endpoint, view_func=wrapper, methods=[op.method])
        OPERATIONS.append(op)
        return view

    return decorate


def node_endpoints() -> frozenset[str]:
    """The Flask endpoints of the routes registered with `nodes=True`."""
    return frozenset(f"{bp.name}.{op.endpoint}" for op in OPERATIONS if op.nodes)


def blueprint() -> Blueprint:
    """The blueprint with every view of this package's modules registered."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return bp


def _handle(op: Operation, view, path_args: dict):
    principal = authorize(op.role)
    if op.path:
        path_args = _validated(op.path, path_args, "path").model_dump()
    query = _parse_query(op.query) if op.query else None
    body = _parse_body(op.body, op.forms) if op.body else None
    result = view(principal=principal, body=body, query=query, **path_args)
    return result if isinstance(result, Response) else reply(result, status=op.status)


def reply(data, *, status: int = 200, etag: str | None = None,
          headers: dict | None = None) -> Response:
    """A JSON answer (None: 204 and no body), with an ETag (quoted here) when given."""
    if data is None:
        response = Response(status=204)
    else:
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json", by_alias=True)
        response = jsonify(data)
        response.status_code = status
    if etag is not None:
        response.headers["ETag"] = f'"{etag}"'
    response.headers.update(headers or {})
    return response


def config() -> Config:
    """The app's config (the state dir and settings), for views."""
    return current_app.config["PROVISIOND"]


def token_store() -> TokenStore:
    """This app's token store (it parses the file again only when the file changed), read
    through the server's copy of the store (BootServices.reads)."""
    store = current_app.extensions.get("provisiond.tokens")
    if store is None:
        store = current_app.extensions["provisiond.tokens"] = TokenStore(
            config(), reads=current_app.extensions["provisiond"].reads)
    return store


def authorize(role: Role | None) -> Principal | None:
    """The request's principal if its token has at least `role` (None: open route).
    No token: Unauthenticated; an unknown, expired or revoked one too, and an
    `auth.denied` event; too small a role: Forbidden, and the event."""
    if role is None:
        return None
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("this needs a bearer token (Authorization: Bearer TOKEN)")
    try:
        principal = token_store().authenticate(token.strip())
    except TokenRefused as exc:
        _denied(exc.name, {"reason": exc.reason, "token": exc.name})
        raise
    except InvalidInput as exc:  # tokens.json cannot be read: the server's fault, not the
        log.error("%s", exc)     # client's, and its path is no business of the client's
        raise ProvisiondError("the server cannot read its token store (see its log)") \
            from None
    if principal.role < role:
        _denied(principal.name, {"reason": "role", "token": principal.name,
                                 "role": principal.role.label, "needed": role.label})
        raise Forbidden(f"token {principal.name!r} has the role {principal.role.label}; "
                        f"{request.method} {request.path} needs {role.label}")
    return principal


def _where() -> dict:
    return {"method": request.method, "path": request.path[:200],
            "address": request.remote_addr}


def _denied(subject: str | None, data: dict) -> None:
    """An `auth.denied` event, unless this address had DENIED_EVENTS of them in the last
    DENIED_WINDOW seconds (per worker): a client looping over bad tokens would otherwise
    fill the bounded journal and push every other event out of it."""
    where = _where()
    limiter = current_app.extensions.setdefault("provisiond.denied", DeniedEvents())
    if limiter.allow(where["address"] or "", time.monotonic()):
        journal.emit(config(), "auth.denied", subject, {**data, **where})


DENIED_EVENTS = 20
DENIED_WINDOW = 60.0
DENIED_ADDRESSES = 4096  # remembered at once; the oldest go first


class DeniedEvents:
    """How many auth.denied events each address had in its current window."""

    def __init__(self):
        self.windows: dict[str, tuple[float, int]] = {}

    def allow(self, address: str, now: float) -> bool:
        start, count = self.windows.pop(address, (now, 0))
        if now - start >= DENIED_WINDOW:
            start, count = now, 0
        self.windows[address] = (start, count + 1)
        if len(self.windows) > DENIED_ADDRESSES:
            self.windows.pop(next(iter(self.windows)))
        if count == DENIED_EVENTS:
            log.warning("auth.denied from %s: over %d in %.0f s, not journaled for the rest "
                        "of that time", address, DENIED_EVENTS, DENIED_WINDOW)
        return count < DENIED_EVENTS


def _parse_query(model: type[BaseModel]) -> BaseModel:
    data = {}
    for key in request.args:
        values = request.args.getlist(key)
        if len(values) > 1:
            raise InvalidInput(f"query parameter {key!r} is given {len(values)} times",
                               field=key)
        data[key] = values[0]
    return _validated(model, data, "query")


def _validated(model: type[BaseModel], data: dict, where: str) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, where) from None


def _parse_body(model: type[BaseModel], forms: bool = False) -> BaseModel:
    if forms and request.mimetype in FORM_TYPES:
        try:
            return model.model_validate(request.form.to_dict())
        except ValidationError as exc:
            raise _invalid(exc, "body") from None
    if request.mimetype not in JSON_TYPES:
        raise UnsupportedMediaType(f"send the body as application/json, not "
                           f"{request.mimetype or 'no content type'}")
    raw = _body_bytes()
    check_json(raw)
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _invalid(exc, "body") from None


def _body_bytes() -> bytes:
    """The request body. A Content-Length above MAX_CONTENT_LENGTH is a 413 before anything
    is read; a chunked body is cut at that length by werkzeug without an error, so a body
    that fills it is taken for larger (its first 64 KiB may be JSON that the whole is not)."""
    raw = request.get_data(cache=False)
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if request.content_length is None and limit is not None and len(raw) >= limit:
        raise TooLarge(f"the body is larger than {limit} bytes")
    return raw


def check_json(raw: bytes):
    """The JSON document `raw` holds; malformed JSON, a key given twice, NaN or Infinity,
    or nesting too deep for Python: InvalidInput."""
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"the body is not JSON: {exc}"[:300]) from None
    except RecursionError:
        raise InvalidInput("the body's JSON nests too deep") from None


def _unique_keys(pairs: list) -> dict:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise InvalidInput(f"the body names {twice!r} twice", field=twice)
    return data


def _no_constant(name: str):
    raise InvalidInput(f"the body holds {name}, which JSON does not allow")


def _invalid(exc: ValidationError, where: str) -> InvalidInput:
    """A pydantic error as InvalidInput naming the field (dotted) and the problem."""
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"] if part != "[key]") or None
    return InvalidInput(f"{where}: {describe_validation_error(exc, from_yaml=False)}",
                        field=field)


def if_match() -> list[str] | None:
    """The entity tags of the request's If-Match header (["*"] for any), or None without
    one. A weak tag never matches (RFC 9110 13.1.1: strong comparison). A malformed header
    is InvalidInput: taken for no precondition, it would let a stale write through."""
    value = request.headers.get("If-Match")
    if value is None:
        return None
    if value.strip() == "*":
        return ["*"]
    tags, pos = [], 0
    while pos < len(value):
        match = _ETAG_RE.match(value, pos)
        if not match or match.end() == pos:
            raise InvalidInput(f"If-Match: not a list of quoted entity tags: {value[:80]!r}",
                               field="If-Match")
        if not match[1]:
            tags.append(match[2])
        pos = match.end()
    if not tags and "W/" not in value:
        raise InvalidInput("If-Match: no entity tag", field="If-Match")
    return tags
