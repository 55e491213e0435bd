"""The inventory file: YAML in stable order, every write atomic, locked and revisioned."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator

import yaml
from pydantic import ValidationError

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.documents import SCHEMA_KEY, Schema, backup_path, load_yaml_mapping
from provisiond.errors import InvalidInventory, StaleRevision
from provisiond.inventory.model import Inventory
from provisiond.inventory.values import CONTROL_RE, check_text
from provisiond.inventory.validate import validate_inventory

HEADER = "# provisiond inventory; edit with `provisiond node|profile|apply` (atomic, locked)\n"
# The file's format (`schema:`): no older one to migrate yet (Schema's migrations go here).
INVENTORY_SCHEMA = Schema("inventory", 1)


class InventoryStore:
    """Reads and writes `<state>/inventory.yaml`.

    Readers never lock: every write replaces the file by rename, so a reader sees a whole
    old or a whole new file. Writers serialise on `<state>/inventory.lock`.

    YAML is slow to parse (1.5 s for 10,000 nodes even with libyaml), so beside it lives a
    JSON copy of the parsed data keyed by the YAML's sha256: a reader whose YAML hashes the
    same loads the JSON (20x faster); a hand-edited or pulled YAML simply misses the cache.
    """

    def __init__(self, config: Config):
        self.config = config
        self.path = config.inventory_path
        self.lock_path = config.state_dir / "inventory.lock"
        self.cache_path = config.state_dir / ".inventory.cache.json"
        self.read_schema = INVENTORY_SCHEMA.current
        """The schema of the file last read (an older one is migrated on read)."""

    def read(self) -> Inventory:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Inventory()
        digest = hashlib.sha256(raw).hexdigest()
        data = self._cached(digest)
        if data is None:
            data = load_inventory_yaml(raw, str(self.path))
            self._write_cache(digest, data)
        data, self.read_schema = INVENTORY_SCHEMA.upgrade(data, str(self.path), InvalidInventory)
        return validate_inventory_data(data, str(self.path))

    def _cached(self, digest: str) -> dict | None:
        try:
            cache = json.loads(self.cache_path.read_bytes())
        except (OSError, ValueError):
            return None
        return cache.get("data") if cache.get("sha256") == digest else None

    def _write_cache(self, digest: str, data: dict) -> None:
        """Best effort: a reader without write access to the state dir just parses YAML."""
        with contextlib.suppress(OSError, TypeError, ValueError):
            blob = json.dumps({"sha256": digest, "data": data}, separators=(",", ":"))
            write_atomic(self.cache_path, blob, durable=False)

    @contextlib.contextmanager
    def edit(self, expected_revision: int | None = None, *, write: bool = True,
             check: Callable[[Inventory, list[tuple[str, str]]], None] | None = None
             ) -> Iterator[Inventory]:
        """Yield a copy of the inventory to change; on a clean exit it is validated, then
        `check(draft, changed)` sees the ('nodes'|'profiles', name) records that changed,
        then, if anything changed and `write`, it is written with the next revision. An
        exception writes nothing; `write=False` checks exactly what a write would."""
        with locked(self.lock_path):
            current = self.read()
            if expected_revision is not None and expected_revision != current.revision:
                raise StaleRevision(
                    f"inventory revision is {current.revision}, not {expected_revision}: "
                    "reload and retry")
            before = current.to_data()
            draft = current  # read() made it for this edit alone: no copy (2 s for 10,000)
            yield draft
            validate_inventory(draft, self.config)
            data = draft.to_data()
            changed = [(kind, name) for kind in ("profiles", "nodes")
                       for name, record in data[kind].items()
                       if before[kind].get(name) != record]
            if check is not None:
                check(draft, changed)
            draft.revision = before["revision"]
            if data | {"revision": 0} == before | {"revision": 0} or not write:
                return
            draft.revision = data["revision"] = before["revision"] + 1
            text = (HEADER + dump_yaml({SCHEMA_KEY: INVENTORY_SCHEMA.current, **data})).encode()
            if self.read_schema < INVENTORY_SCHEMA.current:  # migrated: keep the original
                shutil.copy2(self.path, backup_path(self.path, self.read_schema))
            write_atomic(self.path, text)
            self._write_cache(hashlib.sha256(text).hexdigest(), data)


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


# libyaml's emitter when PyYAML has it: 3x faster for 10,000 nodes (the largest part of a
# write). It writes the same data; only its text may differ from the Python emitter's in
# rare places (a character beyond the BMP escaped, a closing "..." after an open-ended
# plain scalar).
class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    pass


def _str_presenter(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump_yaml(data, dumper: type = _Dumper) -> str:
    """YAML in the order given (callers sort), block style, for clean git diffs."""
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
