"""The views nodes and profiles share (the two resources differ only in their noun): list
with selectors and pages, create (a range), get (merged with provenance), replace,
merge-patch, delete; each a few lines over provisiond.service.records.

Per record, `ETag` is a digest of the stored record, and PUT, PATCH and DELETE honour
`If-Match`. Requests naming several records (`?names=n[1-4]`) take the collection's ETag,
`"rev-N"` (N the inventory revision, as every answer gives it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from provisiond.api.v1 import (Name, NameCursor, NodeRange, Page, Role, config, if_match,
                               reply, route)
from provisiond.errors import PreconditionFailed
from provisiond.inventory.model import Record
from provisiond.service import records
from provisiond.service.inventory import (DEFAULT_LIMIT, MAX_API_NAMES, MAX_LIMIT, Kind,
                                          Snapshot, expand_names, revision_etag)
from provisiond.states import NodePhase


class RecordDocument(BaseModel):
    name: str
    etag: str = Field(description="the record's ETag: give it as If-Match to change it")
    revision: int = Field(description="the inventory revision this was read at")
    record: Record = Field(description="the stored record (merged=true: the effective one)")
    provenance: dict[str, str] | None = Field(
        None, description="merged=true: which profile (or the node) set each field")


class Created(BaseModel):
    revision: int
    items: list[RecordDocument]


class NewNodes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: NodeRange = Field(description=f"a name or a range such as n[001-064] (at most "
                                         f"{MAX_API_NAMES:,} names): MACs and addresses "
                                         "count up from the ones given")
    record: Record


class NewProfiles(NewNodes):
    names: Name = Field(description="the profile's name")


class MergePatch(RootModel[dict[str, Any]]):
    """An RFC 7386 merge patch of a record: null removes a field, an object merges, any
    other value replaces."""


class NodeNames(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: NodeRange = Field(description=f"a name or range (at most {MAX_API_NAMES:,})")


class ProfileNames(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: Name = Field(description="a profile's name")


class RecordName(BaseModel):
    name: Name


class ProfileQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    names: NodeRange | None = Field(None, description="a name or range: only these")
    tag: str | None = Field(None, description="KEY or KEY=VALUE", max_length=200)
    image: str | None = Field(None, max_length=63)
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    continue_: NameCursor | None = Field(None, alias="continue")


class NodeQuery(ProfileQuery):
    profile: str | None = Field(None, description="nodes listing this profile", max_length=63)
    image: str | None = Field(None, description="of the merged record", max_length=63)
    phase: NodePhase | None = None
    merged: bool = Field(False, description="the effective records, with provenance")


class GetQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    merged: bool = Field(False, description="the effective record, with provenance")


def register(kind: Kind, query_model: type[ProfileQuery], new_model: type[NewNodes],
             names_model: type[BaseModel]) -> None:
    """The routes of one record kind under /<kind>s."""
    base, noun, tags = f"/{kind.key}", kind.noun, (kind.key,)

    def list_records(principal, body, query):
        found, cursor = records.list_records(
            config(), kind, _selector(query), limit=query.limit, after=query.continue_,
            merged=getattr(query, "merged", False))
        revision = found[0].revision if found else records.snapshot(config()).revision
        return reply({"items": [item.to_data() for item in found], "continue": cursor},
                     etag=revision_etag(revision))

    def create(principal, body: NewNodes, query):
        names = kind.names(body.names, MAX_API_NAMES)
        written = records.create_records(config(), principal.actor, kind, names,
                                         body.record.to_data(),
                                         expected_revision=_revision(if_match()))
        view = Snapshot(written)
        items = [records.view_of(view, kind, name).to_data() for name in names]
        etag = items[0]["etag"] if len(items) == 1 else None
        return reply({"revision": written.revision, "items": items}, status=201, etag=etag)

    def patch_many(principal, body: MergePatch, query: NodeNames):
        names = _existing(kind, query.names)
        written = records.patch_records(config(), principal.actor, kind, names, body.root,
                                        expected_revision=_revision(if_match()))
        view = Snapshot(written)
        return reply({"revision": written.revision,
                      "items": [records.view_of(view, kind, n).to_data() for n in names]})

    def delete_many(principal, body, query: NodeNames):
        records.delete_records(config(), principal.actor, kind, _existing(kind, query.names),
                               expected_revision=_revision(if_match()))

    def get(principal, body, query: GetQuery, name: str):
        found = records.get_record(config(), kind, name, merged=query.merged)
        return reply(found.to_data(), etag=found.etag)

    def replace(principal, body: Record, query, name: str):
        written, created = records.replace_record(config(), principal.actor, kind, name,
                                                  body.to_data(), etags=if_match())
        return _one(written, kind, name, 201 if created else 200)

    def patch(principal, body: MergePatch, query, name: str):
        written = records.patch_records(config(), principal.actor, kind, [name], body.root,
                                        etags=if_match())
        return _one(written, kind, name)

    def delete(principal, body, query, name: str):
        records.delete_records(config(), principal.actor, kind, [name], etags=if_match())

    for view, rule, method, role, summary, extra in (
            (list_records, base, "GET", Role.READER, f"List {kind.key} (selectors, pages)",
             {"query": query_model, "response": Page[RecordDocument]}),
            (create, base, "POST", Role.ADMIN, f"Create {kind.key}",
             {"body": new_model, "response": Created, "status": 201}),
            (patch_many, base, "PATCH", Role.ADMIN, f"Merge-patch several {kind.key}",
             {"body": MergePatch, "query": names_model, "response": Created}),
            (delete_many, base, "DELETE", Role.ADMIN, f"Delete several {kind.key}",
             {"query": names_model, "status": 204}),
            (get, f"{base}/<name>", "GET", Role.READER, f"Get a {noun}",
             {"query": GetQuery, "response": RecordDocument, "path": RecordName}),
            (replace, f"{base}/<name>", "PUT", Role.ADMIN, f"Replace (or create) a {noun}",
             {"body": Record, "response": RecordDocument, "also": (201,),
              "path": RecordName}),
            (patch, f"{base}/<name>", "PATCH", Role.ADMIN, f"Merge-patch a {noun}",
             {"body": MergePatch, "response": RecordDocument, "path": RecordName}),
            (delete, f"{base}/<name>", "DELETE", Role.ADMIN, f"Delete a {noun}",
             {"status": 204, "path": RecordName})):
        view.__doc__ = None
        route(rule, method, role=role, summary=summary, tags=tags,
              operation_id=f"{noun}_{view.__name__}", **extra)(view)


def _one(written, kind: Kind, name: str, status: int = 200):
    found = records.view_of(Snapshot(written), kind, name)
    return reply(found.to_data(), status=status, etag=found.etag)


def _existing(kind: Kind, pattern: str) -> list[str]:
    return kind.existing(records.snapshot(config()).inventory, pattern, MAX_API_NAMES)


def _selector(query) -> records.Selector:
    names = frozenset(expand_names(query.names)) if query.names else None
    phase = getattr(query, "phase", None)
    return records.Selector(names=names, tag=query.tag, image=query.image,
                            profile=getattr(query, "profile", None),
                            phase=phase.value if phase else None)


def _revision(tags: list[str] | None) -> int | None:
    """The inventory revision an If-Match on a collection names (None: any)."""
    if tags is None or "*" in tags:
        return None
    for tag in tags:
        if tag.startswith("rev-") and tag[4:].isdigit():
            return int(tag[4:])
    raise PreconditionFailed(f"If-Match on a collection takes its ETag \"rev-N\", not "
                             f"{', '.join(tags) or 'a weak tag'}", field="If-Match")
