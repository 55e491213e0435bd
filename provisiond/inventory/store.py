"""The inventory: `inventory.yaml` on the store (provisiond.state), YAML in stable order,
every write a compare-and-swap of the whole text, revisioned."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from provisiond import __version__
from provisiond.atomic import write_atomic
from provisiond.config import Config
from provisiond.documents import SCHEMA_KEY, Schema, backup_path, load_yaml_mapping
from provisiond.errors import InvalidInventory, StaleRevision, Unavailable
from provisiond.inventory.merge import Node, merge_all, merge_nodes
from provisiond.inventory.model import Inventory
from provisiond.inventory.text import (CANONICAL, SECTIONS, Text, dump_yaml, read_changes,
                                       sort_key, split_pieces)
from provisiond.inventory.values import CONTROL_RE, check_text
from provisiond.inventory import merge, model, validate, values
from provisiond.inventory.validate import Claims, check_changes, check_inventory
from provisiond.state import open as opening
from provisiond.state.store import ABSENT
from provisiond.state.layout import KEYS, Layout
from provisiond.state.local import Stamp, file_stamp

__all__ = ["InventoryStore", "Version", "dump_yaml", "parse_inventory"]

KEY = str(KEYS.inventory)
HEADER = ("# provisiond inventory; edit with `provisiond node|profile|apply` (atomic, locked).\n"
          "# Each write makes this file anew: comments are not kept (a record has comment:).\n")
# The file's format (`schema:`): no older one to migrate yet (Schema's migrations go here).
INVENTORY_SCHEMA = Schema("inventory", 1)
LOCK_WAIT = 30.0
"""Seconds a writer keeps applying its change again while others' writes win the
compare-and-swap, then gives up with Unavailable."""
VERSIONS_KEPT = 4  # inventories (state dirs) one process keeps parsed: tests make many
CLAIMS_FORMAT = 1
"""The claims file's format. It also names the checks that found them (CHECKS):
claims are trusted only by the same checks, as a later version may check more."""


@dataclass(eq=False)
class Version:
    """One content of inventory.yaml as this process read or wrote it, with what writes
    derive from it. Shared by every reader and writer of the process: never changed, except
    that the derived parts are filled in when first needed."""

    digest: str           # the file's sha256 ("" when there is no file)
    raw: bytes
    data: dict            # the inventory as plain data (Inventory.to_data()'s form)
    inventory: Inventory
    schema: int           # the schema the file had (an older one is migrated on read)
    canonical: bool       # the file is the text this module writes for `data`
    text: Text | None = None
    claims: dict[str, Claims] = field(default_factory=dict)
    """by server address: who holds each MAC, address and BMC (set once checked valid)"""
    read_as: Schema = field(default_factory=lambda: INVENTORY_SCHEMA)
    previous: Version | None = None
    """the version this process held before it, whose claims can be carried over"""
    stored: int = ABSENT
    """the store's revision of the key when this process last read or wrote it (ABSENT:
    no inventory)"""

    @property
    def revision(self) -> int:
        return self.inventory.revision

    def claims_for(self, server: str) -> Claims | None:
        """The claims of this version for a server at `server`, if known valid: checked so
        in this process, or carried over from the previous version's (the nodes that differ
        checked against them, as a write would: profiles must be the same)."""
        before = self.previous
        if server not in self.claims and before is not None and server in before.claims \
                and before.data["profiles"] == self.data["profiles"]:
            changed = _differing(before.data["nodes"], self.data["nodes"])
            with contextlib.suppress(InvalidInventory, ValueError):  # ValueError: pydantic's
                self.claims[server] = check_changes(self.inventory, before.claims[server],
                                                    changed)
        return self.claims.get(server)

    def pieces(self) -> Text:
        """The per-record pieces of the file's text (read back from a canonical file)."""
        before = self.previous
        if self.text is None and self.canonical and before is not None \
                and before.text is not None:
            self.text = before.text.changed(
                {s: _differing(before.data[s], self.data[s]) for s in SECTIONS})
        if self.text is None:
            pieces = None
            if self.canonical:
                pieces = split_pieces(self.raw.decode(), _head(self.revision), self.data)
            self.text = Text.of(self.data, pieces)
        return self.text


_versions: dict[str, Version] = {}


def _checks_identity() -> str:
    """The release and the sha256 of the modules whose rules decide validity (the records'
    schema, merging, the whole-inventory checks): an upgrade, even one keeping the version
    number (a package built from git), never trusts claims older checks found."""
    digest = hashlib.sha256(__version__.encode())
    for module in (model, merge, validate, values):
        try:
            digest.update(Path(module.__file__).read_bytes())
        except (OSError, TypeError):  # no source to read: never the same as a saved one
            return f"unreadable {time.time_ns()}"
    return digest.hexdigest()


CHECKS = _checks_identity()
"""Hashed as this module is imported, just after the modules it names: the sources read
later may be an upgrade installed under a running process (a server started on an empty
inventory first saved claims at its first write), whose label would make the upgraded CLI
trust what the older checks found."""


class InventoryStore:
    """Reads and writes `inventory.yaml` on the store.

    Nobody locks: a reader gets a whole value, and a writer puts its text only if the
    key's revision is still the one it read (compare-and-swap); when another writer won,
    the writer applies its records' changes to what that one wrote (`_rebase`), unless
    that one changed one of the same records (RecordChanged: the caller edits again).

    YAML is slow to parse (1.5 s for 10,000 nodes even with libyaml), so beside it lives a
    JSON copy of the parsed data keyed by the YAML's sha256: a reader whose YAML hashes the
    same loads the JSON (20x faster); a hand-edited or pulled YAML simply misses the cache.
    Each process also keeps the last version it read or wrote, keyed by that sha256 (a
    file of 10,000 nodes hashes in ~1 ms): a write then checks and dumps only the records
    it changes (see edit_records).
    """

    def __init__(self, config: Config, lock_wait: float = LOCK_WAIT):
        self.config = config
        self.store = opening.open_store(config)
        self.path = Layout.of(config).inventory  # what messages name, and this process's cache key
        self.cache_path = Layout.of(config).inventory_cache
        self.claims_path = Layout.of(config).inventory_claims
        self.lock_wait = lock_wait

    def file_stamp(self) -> Stamp | None:
        """The stat of inventory.yaml in the state dir when that file is the inventory (the
        files store of the state dir): what tells a cache the inventory changed without a
        read. None otherwise, or with no file: on etcd a file of that name (absent, or left
        from before the move to etcd) is not the inventory, and a cache asks the store."""
        url = self.store.url
        if not url.startswith("files://") or Path(url.removeprefix("files://")) / KEY != self.path:
            return None
        return file_stamp(self.path)

    @property
    def read_schema(self) -> int:
        """The schema of the file as it is now (an older one is migrated on read)."""
        return self.current().schema

    def read(self) -> Inventory:
        """The inventory, a copy of the caller's own."""
        return Inventory.model_validate(self.current().data)

    def current(self) -> Version:
        """The file's version: the one this process last read or wrote if the file still
        holds it (same sha256), else read anew. Its inventory is shared: read it only."""
        entry = self.store.get(KEY)
        if entry is None:
            return _empty()
        raw = entry.value
        digest = hashlib.sha256(raw).hexdigest()
        kept = _versions.get(str(self.path))
        if kept is not None and kept.digest == digest and kept.read_as == INVENTORY_SCHEMA:
            kept.stored = entry.revision  # the same text written again
            return kept
        version = self._load(raw, digest, kept if kept and kept.read_as == INVENTORY_SCHEMA
                             else None)
        version.stored = entry.revision
        _keep(str(self.path), version)
        return version

    def _load(self, raw: bytes, digest: str, kept: Version | None) -> Version:
        """The version `raw` holds; with the version this process `kept` before it (another
        process wrote since), the records equal to kept's are kept's, not parsed again."""
        if kept is not None and kept.text is not None:
            version = self._load_changes(raw, digest, kept)
            if version is not None:
                return version
        cache = self._cached(digest)
        data = cache.get("data") if cache else None
        if data is None:
            data = load_inventory_yaml(raw, str(self.path))
            self._write_cache(digest, data)
        data, schema = INVENTORY_SCHEMA.upgrade(data, str(self.path), InvalidInventory)
        canonical = bool(cache) and cache.get("canonical") == CANONICAL
        if canonical and kept is not None:  # data in to_data()'s form, as kept's
            inventory = _reusing(kept, data, str(self.path))
        else:
            inventory = validate_inventory_data(data, str(self.path))
        if kept is not None:
            kept.previous = None  # keep one version back, not a chain
        return Version(digest, raw, data if canonical else inventory.to_data(), inventory,
                       schema, canonical, previous=kept)

    def _load_changes(self, raw: bytes, digest: str, kept: Version) -> Version | None:
        """The version `raw` holds, read as its differences from `kept`'s text when it is
        the text this module writes (the JSON cache of 10,000 nodes took 15-130 ms to
        parse in each process after each change); None when it is not."""
        try:
            text = raw.decode()
            found = read_changes(text, f"{HEADER}{SCHEMA_KEY}: {INVENTORY_SCHEMA.current}\n",
                                 kept.text, lambda part: load_inventory_yaml(part, ""))
            if found is None:
                return None
            revision, changes = found
            pieces = kept.text.changed(changes)
            if pieces.yaml_text(_head(revision)) != text:
                return None
            data = {"revision": revision,
                    **{s: _with(s, kept.data[s], changes[s]) for s in SECTIONS}}
            inventory = _reusing(kept, data, str(self.path), changes)
        except (UnicodeDecodeError, InvalidInventory):
            return None  # read whole, which says what is wrong
        if any(getattr(inventory, s)[n].to_data() != d for s in SECTIONS
               for n, d in changes[s].items() if d is not None):
            return None  # not in the form a write gives: read whole
        kept.previous = None
        return Version(digest, raw, data, inventory, INVENTORY_SCHEMA.current, True, pieces,
                       previous=kept)

    def _cached(self, digest: str) -> dict | None:
        try:
            cache = json.loads(self.cache_path.read_bytes())
        except (OSError, ValueError):
            return None
        return cache if isinstance(cache, dict) and cache.get("sha256") == digest else None

    def _write_cache(self, digest: str, data: dict | str) -> None:
        """Best effort: a reader without write access to the state dir just parses YAML."""
        with contextlib.suppress(OSError, TypeError, ValueError):
            blob = data if isinstance(data, str) else json.dumps(
                {"sha256": digest, "data": data}, separators=(",", ":"))
            write_atomic(self.cache_path, blob, durable=False)

    def _claims(self, version: Version) -> Claims | None:
        """The claims of `version` for this server if it is known valid: in this process
        (Version.claims_for), else from the claims file, written for this very text and
        server by these checks. A CLI run is a new process: without the file its first
        write of one node checked all 10,000 (~0.6 s of its ~1.1 s)."""
        server = self.config.server.address
        claims = version.claims_for(server)
        if claims is None and version.digest:
            claims = self._saved_claims(version.digest, server)
            if claims is not None:
                version.claims[server] = claims
        return claims

    def _saved_claims(self, digest: str, server: str) -> Claims | None:
        try:
            saved = json.loads(self.claims_path.read_bytes())
            if saved.get("sha256") != digest or saved.get("server") != server \
                    or saved.get("format") != CLAIMS_FORMAT \
                    or saved.get("checks") != CHECKS:
                return None
            return Claims.from_json(saved["claims"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None  # none, another text's or damaged: checked whole, as before

    def _save_claims(self, digest: str, claims: Claims) -> None:
        """Best effort, as the JSON cache: a reader that cannot write just checks again."""
        if not digest:
            return
        with contextlib.suppress(OSError, TypeError, ValueError):
            write_atomic(self.claims_path, json.dumps(
                {"sha256": digest, "server": self.config.server.address,
                 "format": CLAIMS_FORMAT, "checks": CHECKS,
                 "claims": claims.to_json()}, separators=(",", ":")), durable=False)

    def valid_nodes(self, before: tuple[Version, dict[str, Node]] | None = None
                    ) -> tuple[Version, dict[str, Node]]:
        """The current version, checked valid with this config (validate_inventory's rules:
        InvalidInventory naming the first problem), and every node of it merged. Given the
        version `before` and its merged nodes, the nodes that did not change are reused
        (its profiles unchanged) and its claims carried over as a write would."""
        version = self.current()
        server = self.config.server.address
        if self._claims(version) is None:
            nodes, version.claims[server] = check_inventory(version.inventory, self.config)
            self._save_claims(version.digest, version.claims[server])
            return version, nodes
        if before is None or before[0].data["profiles"] != version.data["profiles"]:
            return version, merge_all(version.inventory)
        changed = _differing(before[0].data["nodes"], version.data["nodes"])
        fresh = merge_nodes(version.inventory, [n for n, d in changed.items() if d is not None])
        return version, {name: fresh.get(name) or before[1][name]
                         for name in version.data["nodes"]}

    @contextlib.contextmanager
    def edit(self, expected_revision: int | None = None, *, write: bool = True,
             check: Callable[[Inventory, list[tuple[str, str]]], None] | None = None
             ) -> Iterator[Inventory]:
        """Yield a copy of the inventory to change; on a clean exit it is validated, then
        `check(draft, changed)` sees the ('nodes'|'profiles', name) records that changed,
        then, if anything changed and `write`, it is written with the next revision. An
        exception writes nothing; `write=False` checks exactly what a write would."""
        base = self._base(expected_revision)
        draft = Inventory.model_validate(base.data)
        yield draft
        self._commit_again(base, draft, _changes(base, draft, draft.to_data()), check, write,
                           expected_revision)

    @contextlib.contextmanager
    def edit_records(self, expected_revision: int | None = None, *, write: bool = True,
                     check: Callable[[Inventory, list[tuple[str, str]]], None] | None = None
                     ) -> Iterator[Inventory]:
        """edit(), for a change of a few records in a large inventory: the inventory yielded
        shares its records with the one read (and with this process's readers), so records
        may be added, replaced or removed, never changed in place. Only the records replaced
        are compared, checked (validate.check_changes) and dumped."""
        base = self._base(expected_revision)
        stored = base.inventory
        draft = Inventory.model_construct(revision=stored.revision,
                                          profiles=dict(stored.profiles),
                                          nodes=dict(stored.nodes))
        yield draft
        self._commit_again(base, draft, _changes(base, draft), check, write, expected_revision)

    def _base(self, expected_revision: int | None) -> Version:
        """The current version, at `expected_revision` if given."""
        base = self.current()
        if expected_revision is not None and expected_revision != base.revision:
            raise StaleRevision(f"inventory revision is {base.revision}, not "
                                f"{expected_revision}: reload and retry")
        return base

    def _commit_again(self, base: Version, draft: Inventory, changes: dict[str, dict],
                      check: Callable | None, write: bool, expected_revision: int | None
                      ) -> None:
        """_commit; while another writer wins the compare-and-swap, the same changes made
        to what it wrote (`_rebase`) and committed again, for up to lock_wait seconds. With
        an `expected_revision` the caller's view is stale then: StaleRevision. The caller's
        `draft` ends as what was written."""
        deadline = time.monotonic() + self.lock_wait
        while True:
            try:
                self._commit(base, draft, changes, check, write)
                return
            except _Lost:
                pass
            newer = self._base(expected_revision)
            if time.monotonic() > deadline:
                raise Unavailable(f"{self.path}: written by others for "
                                  f"{self.lock_wait:.0f} s; try again") from None
            changes = _rebase(base, newer, changes)
            rebased = _reusing(newer, {"revision": newer.revision, **{
                s: _with(s, newer.data[s], changes[s]) for s in SECTIONS}},
                str(self.path), changes)
            changes = {s: {n: None if d is None else getattr(rebased, s)[n].to_data()
                           for n, d in changes[s].items()} for s in SECTIONS}
            for name in ("revision", *SECTIONS):
                setattr(draft, name, getattr(rebased, name))
            base = newer

    def _commit(self, base: Version, draft: Inventory, changes: dict[str, dict],
                check: Callable | None, write: bool) -> None:
        """Validate `draft` (`changes`: section -> name -> its data, None if removed), let
        `check` see it, then write it as the next version (_Lost if the store's key is no
        longer `base`)."""
        claims = self._validate(base, draft, changes)
        if check is not None:
            check(draft, [(section, name) for section in SECTIONS
                          for name, data in sorted(changes[section].items(), key=_order(section))
                          if data is not None])
        draft.revision = base.revision
        if not write:
            return
        if not any(changes.values()):
            base.claims[self.config.server.address] = claims
            self._save_claims(base.digest, claims)
            return
        draft.revision = revision = base.revision + 1
        text = base.pieces().changed(changes)
        raw = text.yaml_text(_head(revision)).encode()
        if base.schema < INVENTORY_SCHEMA.current:  # migrated: keep the original
            self.store.put(str(backup_path(Path(KEY), base.schema)), base.raw)
        try:
            stored = self.store.put(KEY, raw, expect=base.stored)
        except StaleRevision:
            raise _Lost() from None
        digest = hashlib.sha256(raw).hexdigest()
        self._write_cache(digest, text.json_text(revision, digest, INVENTORY_SCHEMA.current))
        self._save_claims(digest, claims)
        data = {"revision": revision,
                **{s: _with(s, base.data[s], changes[s]) for s in SECTIONS}}
        _keep(str(self.path), Version(digest, raw, data, draft, INVENTORY_SCHEMA.current, True,
                                      text, {self.config.server.address: claims},
                                      stored=stored))

    def _validate(self, base: Version, draft: Inventory, changes: dict[str, dict]) -> Claims:
        """The claims of the valid `draft`: only its changed nodes checked when `base` was
        found valid and no profile changed, else the whole of it."""
        claims = self._claims(base)
        if claims is None or changes["profiles"]:
            return check_inventory(draft, self.config)[1]
        return check_changes(draft, claims, changes["nodes"])


class _Lost(Exception):
    """Another writer changed the inventory after the version a commit was based on."""


class RecordChanged(StaleRevision):
    """Another writer changed a record this write changes, after this writer read it: what
    the caller decided from the record (an If-Match, a field it kept) may no longer hold.
    Run the whole edit again (service.records.write_records does)."""


def _rebase(old: Version, new: Version, changes: dict[str, dict]) -> dict[str, dict]:
    """`changes` (made to `old`) made to `new` instead, when no record we change was
    changed by the other writer too (RecordChanged: the caller decides again)."""
    rebased: dict[str, dict] = {}
    for section in SECTIONS:
        rebased[section] = {}
        for name, ours in changes[section].items():
            theirs = new.data[section].get(name)
            if theirs != old.data[section].get(name):
                raise RecordChanged(f"{section[:-1]} {name} was changed by another writer "
                                    "meanwhile: reload and retry")
            if ours != theirs:
                rebased[section][name] = ours
    return rebased


def _changes(base: Version, draft: Inventory, data: dict | None = None
             ) -> dict[str, dict[str, dict | None]]:
    """Section -> name -> new data (None: removed) of the records whose data differs from
    `base`: among every record when the draft's `data` is given, else among the records
    the draft does not share with `base`."""
    found: dict[str, dict[str, dict | None]] = {}
    for section in SECTIONS:
        records = getattr(draft, section)
        if data is not None:
            after = data[section]
        else:
            stored = getattr(base.inventory, section)
            after = {name: record.to_data() for name, record in records.items()
                     if stored.get(name) is not record}
        found[section] = _differing(base.data[section], after, records)
    return found


def _differing(before: dict[str, dict], after: dict[str, dict], present=None
               ) -> dict[str, dict | None]:
    """name -> data of the records of `after` that differ from `before`'s, and -> None for
    the names of `before` no longer `present` (by default: in `after`)."""
    present = after if present is None else present
    found: dict[str, dict | None] = {n: d for n, d in after.items() if before.get(n) != d}
    found.update((name, None) for name in before if name not in present)
    return found


def _reusing(kept: Version, data: dict, origin: str, changes: dict | None = None
             ) -> Inventory:
    """The inventory of `data` (in to_data()'s form), in which only the records that differ
    from `kept`'s (or are named in `changes`) are validated anew: the others are kept's own
    (records are shared, never changed in place)."""
    if changes is not None:
        fresh = {s: {n: d for n, d in changes[s].items() if d is not None} for s in SECTIONS}
    else:
        fresh = {s: {n: d for n, d in data[s].items() if kept.data[s].get(n) != d}
                 for s in SECTIONS}
    checked = validate_inventory_data({**data, **fresh}, origin)
    records = {s: {n: getattr(checked if n in fresh[s] else kept.inventory, s)[n]
                   for n in data[s]} for s in SECTIONS}
    return Inventory.model_construct(revision=checked.revision, **records)


def _with(section: str, records: dict[str, dict], changes: dict[str, dict | None]
          ) -> dict[str, dict]:
    """`records` of `section` (in file order) with `changes` made, still in file order."""
    if not changes:
        return records
    if all(name in records for name in changes):  # replaced or removed: the order holds
        return {name: changes.get(name, data) for name, data in records.items()
                if changes.get(name, data) is not None}
    merged = {**records, **changes}
    return {name: merged[name] for name in sorted(merged, key=sort_key(section))
            if merged[name] is not None}


def _order(section: str):
    key = sort_key(section)
    return (lambda item: key(item[0])) if key else (lambda item: item[0])


def _head(revision: int) -> str:
    """The file's lines before its records."""
    return f"{HEADER}{SCHEMA_KEY}: {INVENTORY_SCHEMA.current}\nrevision: {revision}\n"


def _empty() -> Version:
    data = {"revision": 0, "profiles": {}, "nodes": {}}
    return Version("", b"", data, Inventory(), INVENTORY_SCHEMA.current, False)


def _keep(path: str, version: Version) -> None:
    _versions.pop(path, None)
    if len(_versions) >= VERSIONS_KEPT:
        _versions.pop(next(iter(_versions)))
    _versions[path] = version


def parse_inventory(text: str, origin: str) -> Inventory:
    """Parse and schema-check inventory YAML; errors name the record and field."""
    data, _ = INVENTORY_SCHEMA.upgrade(load_inventory_yaml(text, origin), origin,
                                       InvalidInventory)
    return validate_inventory_data(data, origin)


def load_inventory_yaml(text: str | bytes, origin: str) -> dict:
    return load_yaml_mapping(text, origin, InvalidInventory,
                             "a mapping with 'nodes' and 'profiles'")


def validate_inventory_data(data: dict, origin: str) -> Inventory:
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        raise InvalidInventory(f"{origin}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError, from_yaml: bool = True) -> str:
    """One line from pydantic's first error: 'node n001: netdevs.eth0.mac: invalid ...'.
    `from_yaml`: the data was YAML, and a value YAML read as no string gets a hint quoting
    it (never for JSON: the hint would be wrong there, and would echo a secret's value)."""
    err = exc.errors()[0]
    loc = [_loc_part(p) for p in err["loc"] if p != "[key]"]
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    if err["type"] == "string_pattern_mismatch":  # the Text pattern: a control character
        message = _control_message(err["input"]) or message
    message += _yaml_hint(err) if from_yaml else ""
    if len(loc) >= 2 and loc[0] in ("nodes", "profiles"):
        kind = loc[0].rstrip("s")
        field = ".".join(loc[2:])
        return f"{kind} {loc[1]}: {field + ': ' if field else ''}{message}"
    return f"{'.'.join(loc)}: {message}" if loc else message


def _loc_part(part) -> str:
    """A field path part; a mapping key holding a control character is shown escaped."""
    text = str(part)
    return repr(text) if CONTROL_RE.search(text) else text


def _control_message(value: str) -> str | None:
    """check_text's message for a value holding a control character, else None."""
    try:
        check_text(value)
    except ValueError as exc:
        return str(exc)
    return None


def _yaml_hint(err: dict) -> str:
    """Unquoted YAML 1.1 reads `yes`/`no`/`on` as booleans and 52:54:00:00:00:01 as a
    base-60 number: say so where a string was expected."""
    value = err.get("input")
    kind = yaml_read_as(value)
    if err["type"] != "string_type" or kind is None:
        return ""
    return f" (YAML read the value as {kind}, {value!r}: put it in quotes)"


def yaml_read_as(value) -> str | None:
    """What YAML made of an unquoted scalar meant as a string: a boolean, a number (010 is
    8, 1_000 is 1000, 12:30 is 750) or null; None for a string or a collection."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number" if isinstance(value, (int, float)) else None
