"""Reading the YAML documents provisiond is driven by (settings, inventory, recipes,
overlay metadata, apply files): libyaml when present, one clear line on any error; and the
schema versions of the two it writes (settings, inventory)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from provisiond.errors import InvalidInput

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A mapping names the same key twice: YAML would keep the last one silently."""


class YamlLoader(_Base):
    def construct_mapping(self, node, deep=False):
        """Refuse duplicate keys (a repeated node would silently replace the first one);
        `<<` merge keys may still be overridden, as YAML intends."""
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if first is not None:  # on another line, or the same one (flow style)
                    raise DuplicateKey(f"line {line}: duplicate key {key!r} "
                                       f"(first given at line {first})")
                seen[key] = line
        return super().construct_mapping(node, deep)


def decode_text(raw: str | bytes, origin: str, error: type[InvalidInput] = InvalidInput) -> str:
    """`raw` as text; bytes that are not UTF-8 are one line naming where."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{origin}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                    f"{exc.start})") from None


MAX_DEPTH = 100  # our documents nest 5 levels; libyaml's composer segfaults near 50,000
MAX_EXPANDED = 1_000_000  # values after aliases are expanded, when aliases multiply them


def check_shape(text: str, origin: str, error: type[InvalidInput] = InvalidInput) -> None:
    """Refuse, before anything is built from it, nesting deeper than MAX_DEPTH and aliases
    that multiply the document (a 460-byte "billion laughs" text wrote an 89 MB inventory
    cache, one level more 890 MB): libyaml's composer recurses in C (a segfault, not an
    exception), deepcopy, pydantic and json in Python. The parser's events come from a
    loop, not a recursion. A text with no alias and few brackets and shallow lines can do
    neither, so it skips that pass."""
    lines = text.splitlines()
    leading = max((len(line) - len(line.lstrip(" -?")) for line in lines), default=0)
    aliases = "&" in text and "*" in text
    if not aliases and text.count("[") + text.count("{") + leading + 2 <= MAX_DEPTH:
        return
    sizes: dict[str, int] = {}   # anchor -> values it stands for, expanded
    stack: list[list] = [[0, None]]   # per open collection: [values so far, its anchor]
    events = 0
    for event in yaml.parse(text, Loader=_Base):
        events += 1
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([1, event.anchor])
            if len(stack) - 1 > MAX_DEPTH:
                line = event.start_mark.line + 1
                raise error(f"{origin}: nested deeper than {MAX_DEPTH} levels (line {line})")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            size, anchor = stack.pop()
            _count(stack, sizes, anchor, size)
        elif isinstance(event, yaml.ScalarEvent):
            _count(stack, sizes, event.anchor, 1)
        elif isinstance(event, yaml.AliasEvent):
            _count(stack, sizes, None, sizes.get(event.anchor, 1))
    expanded = sum(size for size, _ in stack)  # counts only: nothing was expanded yet
    if expanded > max(MAX_EXPANDED, 4 * events):
        raise error(f"{origin}: aliases (*name) expand it to {expanded:,} values; write the "
                    "values out or use profiles")


def _count(stack: list[list], sizes: dict[str, int], anchor: str | None, size: int) -> None:
    """Add a finished value of `size` expanded values to the collection holding it."""
    if anchor:
        sizes[anchor] = size
    stack[-1][0] += size


def load_yaml_mapping(text: str | bytes, origin: str, error: type[InvalidInput] = InvalidInput,
                      expected: str = "a mapping") -> dict:
    """The mapping `text` holds (empty text is {}); `error` names `origin` otherwise."""
    text = decode_text(text, origin, error)
    try:
        check_shape(text, origin, error)
        data = yaml.load(text, Loader=YamlLoader)
    except DuplicateKey as exc:
        raise error(f"{origin}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{origin}: expected {expected}")
    return data


SCHEMA_KEY = "schema"


@dataclass(frozen=True)
class Schema:
    """A document's format version and the steps bringing older ones up to it: a file
    without the key is version 1 (written before versions were); a newer one than this
    provisiond knows is refused, never half-read."""

    name: str
    current: int
    migrations: dict[int, Callable[[dict], dict]] = field(default_factory=dict)
    """version N -> the function turning an N document into an N+1 one"""

    def upgrade(self, data: dict, origin: str, error: type[InvalidInput] = InvalidInput
                ) -> tuple[dict, int]:
        """(the document at the current version, without the key; the version it had)."""
        data = dict(data)
        version = data.pop(SCHEMA_KEY, 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise error(f"{origin}: {SCHEMA_KEY}: {version!r} is not a version (1, 2, ...)")
        if version > self.current:
            raise error(f"{origin}: written by a newer provisiond ({self.name} schema "
                        f"{version}; this one reads up to {self.current}): upgrade provisiond "
                        "(or put back the backup the newer one made when it migrated it)")
        for step in range(version, self.current):
            data = self.migrations[step](data)
        return data, version


def backup_path(path: Path, version: int) -> Path:
    """Where the file as it was at `version` is kept when it is migrated."""
    return path.with_name(f"{path.name}.schema-{version}.bak")
