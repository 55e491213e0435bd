"""Nodes and profiles for the CLI and the API: read, list with selectors and pages, create
(a range with consecutive addresses), replace, merge-patch (RFC 7386), change, delete.

Every write goes through `write_records`: under the inventory lock it checks that the names
exist (or not, to create), the callers' preconditions (a record's ETag, the inventory
revision), applies the change, validates it as the CLI always did (the changed records
against the others: InventoryStore.edit_records), then records who changed which fields
(audit) and tells watchers (`inventory.changed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from provisiond.config import Config
from provisiond.errors import (AlreadyExists, InUse, InvalidInventory, PreconditionFailed,
                               StaleRevision)
from provisiond.inventory.model import Inventory, Record
from provisiond.inventory.ranges import fold, names_head, names_text, spread_addresses
from provisiond.inventory.store import RecordChanged, describe_validation_error
from provisiond.lifecycle import check_forgettable, edit_inventory, forget_nodes
from provisiond.inventory.secrets import SecretStore
from provisiond.service.inventory import (NODES, PROFILES, Kind, Snapshot, check_limit, decode_cursor,
                                          page_of_names, record_etag, snapshot)
from provisiond.service.journal import emit, audit
from provisiond.status import read_status

# A change: (name, the stored record or None) -> the new record, or None to delete it.
Change = Callable[[str, Record | None], Record | None]

EDIT_ATTEMPTS = 50
"""Times a write of records is decided again when another writer changed one of them
meanwhile (a lock would have had it wait and decide on the newer record)."""


@dataclass(frozen=True)
class Selector:
    """Which records a list shows: a node range, a tag (KEY or KEY=VALUE), a profile, an
    image (of the merged node record), a boot phase. None selects all."""

    names: frozenset[str] | None = None
    tag: str | None = None
    profile: str | None = None
    image: str | None = None
    phase: str | None = None

    def keep(self, config: Config, kind: Kind, view: Snapshot) -> Callable[[str], bool] | None:
        tests = []
        if self.names is not None:
            tests.append(lambda name: name in self.names)
        record = (lambda n: view.merged(n).record) if kind is NODES else (
            lambda n: kind.records(view.inventory)[n])
        if self.tag is not None:
            key, sep, value = self.tag.partition("=")
            tests.append(lambda n: key in (record(n).tags or {}) and (
                not sep or record(n).tags[key] == value))
        if self.profile is not None:
            tests.append(lambda n: self.profile in (
                kind.records(view.inventory)[n].profiles or []))
        if self.image is not None:
            tests.append(lambda n: record(n).image == self.image)
        if self.phase is not None:
            tests.append(lambda n: (read_status(config, n) or {}).get("phase") == self.phase)
        return (lambda name: all(test(name) for test in tests)) if tests else None


@dataclass(frozen=True)
class RecordView:
    """A record as the API and `--json` show it: its own data (or the merged record and
    where each field came from), its ETag, the inventory revision it was read at."""

    name: str
    etag: str
    revision: int
    record: dict
    provenance: dict | None = None

    def to_data(self) -> dict:
        data = {"name": self.name, "etag": self.etag, "revision": self.revision,
                "record": self.record}
        if self.provenance is not None:
            data["provenance"] = self.provenance
        return data


def view_of(view: Snapshot, kind: Kind, name: str, merged: bool = False) -> RecordView:
    stored = kind.records(view.inventory)[name]
    if merged and kind is NODES:
        node = view.merged(name)
        return RecordView(name, record_etag(stored), view.revision, node.record.to_data(),
                          dict(node.provenance))
    return RecordView(name, record_etag(stored), view.revision, stored.to_data())


def get_record(config: Config, kind: Kind, name: str, merged: bool = False) -> RecordView:
    view = snapshot(config)
    if name not in kind.records(view.inventory):
        raise kind.not_found(f"no such {kind.noun}: {name}")
    return view_of(view, kind, name, merged)


def list_records(config: Config, kind: Kind, selector: Selector = Selector(), *,
                 limit: int | None = None, after: str | None = None, merged: bool = False
                 ) -> tuple[list[RecordView], str | None]:
    """A page of records in natural name order and the next page's cursor (None: the last
    page); every record at once without `limit`."""
    view = snapshot(config)
    names, keys = view.sorted_names(kind)
    keep = selector.keep(config, kind, view)
    found, cursor = page_of_names(names, keys, decode_cursor(after),
                                  check_limit(limit) if limit else len(names) or 1, keep)
    return [view_of(view, kind, name, merged) for name in found], cursor


def write_records(config: Config, actor: str, kind: Kind, action: str, names: list[str],
                  change: Change, *, create: bool | None = False, etags: list[str] | None = None,
                  expected_revision: int | None = None) -> Inventory:
    """Apply `change` to each named record under the lock (see the module doc): `create`
    needs every name free, otherwise each must exist (a PUT may create: create=None).
    `change` returns a new record: the stored one is shared (InventoryStore.edit_records)
    and must not be changed in place.
    `etags` is an If-Match list ("*": any existing record); `expected_revision` the
    inventory revision the caller read. Returns the written inventory."""
    for attempt in range(EDIT_ATTEMPTS):  # RecordChanged: decide again on the newer record
        deleted: list[str] = []
        before: dict[str, dict | None] = {}
        after: dict[str, dict | None] = {}
        try:
            with edit_inventory(config, expected_revision) as inventory:
                records = kind.records(inventory)
                _check_names(kind, records, names, create)
                for name in names:
                    stored = records.get(name)
                    if etags is not None:
                        check_etag(etags, record_etag(stored), f"{kind.noun} {name}")
                    new = change(name, stored)
                    before[name] = stored.to_data() if stored else None
                    after[name] = new.to_data() if new else None
                    if new is None:
                        check_deletable(inventory, kind, [name])
                        records.pop(name, None)
                        deleted.append(name)
                    else:
                        records[name] = new
            break
        except RecordChanged as exc:
            if expected_revision is not None or attempt == EDIT_ATTEMPTS - 1:
                raise PreconditionFailed(str(exc), field="If-Match") from None
        except StaleRevision as exc:
            raise PreconditionFailed(str(exc), field="If-Match") from None
    if deleted:
        forget_records(config, kind, deleted)
    _tell(config, actor, kind, action, names, before, after, inventory.revision)
    return inventory


def _check_names(kind: Kind, records: dict, names: list[str], create: bool | None) -> None:
    for name in names:
        kind.check_name(name)
    if create:
        taken = [n for n in names if n in records]
        if taken:
            raise AlreadyExists(f"{kind.noun} {fold(taken)} already exists", field="names")
    elif create is False:
        missing = [n for n in names if n not in records]
        if missing:
            raise kind.not_found(f"no such {kind.noun}: {fold(missing)}")


def profile_users(inventory: Inventory) -> dict[str, list[str]]:
    """Profile name -> the nodes listing it."""
    users: dict[str, list[str]] = {}
    for name, record in inventory.nodes.items():
        for profile in record.profiles or []:
            users.setdefault(profile, []).append(name)
    return users


def check_deletable(inventory: Inventory, kind: Kind, names: list[str]) -> None:
    """InUse if a profile to delete is still listed by a node that stays."""
    if kind is NODES:
        return
    users = profile_users(inventory)
    for name in names:
        if users.get(name):
            raise InUse(f"profile {name} is used by node {fold(users[name])}")


def check_etag(tags: list[str], current: str | None, what: str) -> None:
    """PreconditionFailed unless the If-Match `tags` allow a write to `what`, whose ETag is
    `current` (None: it does not exist). "*" matches any existing record."""
    if current is None or ("*" not in tags and current not in tags):
        shown = f"ETag {current!r}" if current else "does not exist"
        raise PreconditionFailed(f"{what} has changed ({shown}; If-Match named "
                                 f"{', '.join(tags) or 'only weak tags'}): read it again "
                                 "and retry", field="If-Match")


def forget_records(config: Config, kind: Kind, names: list[str]) -> None:
    """After deleting records: a node's secrets, host keys, builds and status go too, a
    profile's secrets."""
    if kind is NODES:
        forget_nodes(config, names)
    else:
        SecretStore(config).forget(kind.key, names)


def _tell(config: Config, actor: str, kind: Kind, action: str, names: list[str],
          before: dict, after: dict, revision: int) -> None:
    """Audit and announce the records of `names` that changed (before/after: their data,
    None where there was or is no record)."""
    changed = [n for n in names if before[n] != after[n]]
    if not changed:
        return
    fields = sorted({c["field"] for n in changed for c in field_changes(before[n], after[n])})
    shown = names_text(changed, kind.noun)
    audit(config, actor, f"{kind.noun}.{action}", f"{kind.noun}:{shown}", fields)
    emit(config, "inventory.changed", shown, {
        "revision": revision, "kind": kind.noun, "action": action, "fields": fields,
        "names": names_head(changed), "count": len(changed)})


def field_changes(before: dict | None, after: dict | None) -> list[dict]:
    """Every field set in either record whose value differs, in field order: `field` dotted
    for people, `path` a list for scripts (a netdev or tag name may hold a dot)."""
    old, new = _flatten(before or {}), _flatten(after or {})
    paths = list(old) + [p for p in new if p not in old]
    return [{"field": ".".join(p), "path": list(p), "before": old.get(p), "after": new.get(p)}
            for p in paths if old.get(p) != new.get(p)]


def _flatten(data: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    flat: dict = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, (*prefix, key)))
        else:
            flat[(*prefix, key)] = value
    return flat


def parse_record(data, what: str) -> Record:
    """A record from JSON-like data, with the types JSON has (a string is no number):
    InvalidInventory naming the field."""
    try:
        return Record.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"] if p != "[key]") or None
        raise InvalidInventory(f"{what}: {describe_validation_error(exc, from_yaml=False)}",
                               field=field) from None


def merge_patch(target, patch):
    """RFC 7386: a patch object merges into the target key by key, null removes a key, any
    other value (arrays too) replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def create_records(config: Config, actor: str, kind: Kind, names: list[str], data: dict,
                   *, expected_revision: int | None = None) -> Inventory:
    """New records for `names` from one record's data; a range's addresses count up from
    the ones given (as `node add` does). A node naming no profile gets `default` if that
    profile exists."""
    if kind is NODES and "profiles" not in data:
        current = snapshot(config).inventory
        data = {**data, "profiles": ["default"]} if "default" in current.profiles else data
    records = {name: parse_record(item, f"{kind.noun} {name}")
               for name, item in zip(names, spread_addresses(data, len(names)))}
    return write_records(config, actor, kind, "create", names,
                         lambda name, _: records[name], create=True,
                         expected_revision=expected_revision)


def replace_record(config: Config, actor: str, kind: Kind, name: str, data: dict, *,
                   etags: list[str] | None = None, create: bool | None = None
                   ) -> tuple[Inventory, bool]:
    """PUT: the record becomes `data` exactly; created if absent (create=None) unless
    `etags` were given. Returns the written inventory and whether the record was new (as
    seen under the lock)."""
    record = parse_record(data, f"{kind.noun} {name}")
    created: list[bool] = []

    def change(_, stored: Record | None) -> Record:
        created.append(stored is None)
        return record

    written = write_records(config, actor, kind, "replace", [name], change, create=create,
                            etags=etags)
    return written, created[-1]


def patch_records(config: Config, actor: str, kind: Kind, names: list[str], patch: dict,
                  *, etags: list[str] | None = None,
                  expected_revision: int | None = None) -> Inventory:
    """PATCH: the merge patch applied to each named record."""
    def change(name: str, stored: Record | None) -> Record:
        return parse_record(merge_patch(stored.to_data(), patch), f"{kind.noun} {name}")

    return write_records(config, actor, kind, "patch", names, change, etags=etags,
                         expected_revision=expected_revision)


def delete_records(config: Config, actor: str, kind: Kind, names: list[str], *,
                   etags: list[str] | None = None,
                   expected_revision: int | None = None) -> Inventory:
    """Delete the named records and everything a deleted node owned."""
    check_forgettable(config)
    return write_records(config, actor, kind, "delete", names, lambda *_: None, etags=etags,
                         expected_revision=expected_revision)


def apply_inventory(config: Config, actor: str, desired: Inventory, plan: dict[str, list], *,
                    expected_revision: int, dry_run: bool = False) -> Inventory:
    """`provisiond apply`: carry out a plan (create/update/delete lists of {kind, name}) made
    from the inventory at `expected_revision`; with `dry_run`, check it and write nothing."""
    touched = {kind: [c["name"] for action in ("create", "update", "delete")
                      for c in plan[action] if c["kind"] == kind.noun]
               for kind in (PROFILES, NODES)}
    with edit_inventory(config, expected_revision, write=not dry_run) as inventory:
        before = {kind: _data_of(kind.records(inventory), names)
                  for kind, names in touched.items()}
        for kind, names in touched.items():
            stored, wanted = kind.records(inventory), kind.records(desired)
            for name in names:
                if name in wanted:
                    stored[name] = wanted[name]
                else:
                    del stored[name]
    if dry_run:
        return inventory
    for kind, names in touched.items():
        after = _data_of(kind.records(inventory), names)
        deleted = [n for n in names if after[n] is None]
        if deleted:
            forget_records(config, kind, deleted)
        _tell(config, actor, kind, "apply", names, before[kind], after, inventory.revision)
    return inventory


def _data_of(stored: dict[str, Record], names: list[str]) -> dict[str, dict | None]:
    return {n: stored[n].to_data() if n in stored else None for n in names}
