"""The inventory file: YAML in stable order, every write atomic, locked and revisioned."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import yaml
from pydantic import ValidationError

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.errors import InvalidInventory, StaleRevision
from provisiond.inventory.model import Inventory
from provisiond.inventory.validate import validate_inventory

HEADER = "# provisiond inventory; edit with `provisiond node|profile|apply` (atomic, locked)\n"


class InventoryStore:
    """Reads and writes `<state>/inventory.yaml`.

    Readers never lock: every write replaces the file by rename, so a reader sees a whole
    old or a whole new file. Writers serialise on `<state>/inventory.lock`.
    """

    def __init__(self, config: Config):
        self.path = config.inventory_path
        self.lock_path = config.state_dir / "inventory.lock"

    def read(self) -> Inventory:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return Inventory()
        return parse_inventory(text, str(self.path))

    @contextlib.contextmanager
    def edit(self, expected_revision: int | None = None) -> Iterator[Inventory]:
        """Yield a copy of the inventory to change; on a clean exit it is validated and, if
        it changed, written with the next revision. An exception writes nothing."""
        with locked(self.lock_path):
            current = self.read()
            if expected_revision is not None and expected_revision != current.revision:
                raise StaleRevision(
                    f"inventory revision is {current.revision}, not {expected_revision}: "
                    "reload and retry")
            draft = current.model_copy(deep=True)
            yield draft
            validate_inventory(draft)
            if draft.to_data() | {"revision": 0} == current.to_data() | {"revision": 0}:
                draft.revision = current.revision
                return
            draft.revision = current.revision + 1
            write_atomic(self.path, HEADER + dump_yaml(draft.to_data()))


def parse_inventory(text: str, origin: str) -> Inventory:
    """Parse and schema-check inventory YAML; errors name the record and field."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidInventory(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise InvalidInventory(f"{origin}: expected a mapping with 'nodes' and 'profiles'")
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        raise InvalidInventory(f"{origin}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """One line from pydantic's first error: 'node n001: netdevs.eth0.mac: invalid ...'."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    if len(loc) >= 2 and loc[0] in ("nodes", "profiles"):
        kind = loc[0].rstrip("s")
        field = ".".join(loc[2:])
        return f"{kind} {loc[1]}: {field + ': ' if field else ''}{message}"
    return f"{'.'.join(loc)}: {message}" if loc else message


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump_yaml(data) -> str:
    """YAML in the order given (callers sort), block style, for clean git diffs."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
