"""inventory.yaml's text (and its JSON cache's) put together from one piece per record, so
that a write changing a few records dumps only those: the bytes are the ones a dump of the
whole inventory gives (tests/unit/inventory/test_text.py compares them).

With block style, libyaml writes each record of a mapping the same whatever surrounds it
(same indentation, each record starting a line), with one exception: a document in which a
block scalar with kept trailing line breaks (`|+`) was the last block scalar written ends
with a `...` line. So each piece also says how it leaves that state (open or not).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from provisiond.inventory.model import node_sort_key

SECTIONS = ("profiles", "nodes")
_END = "...\n"


# libyaml's emitter when PyYAML has it: 3x faster for 10,000 nodes (the largest part of a
# write). It writes the same data; only its text may differ from the Python emitter's in
# rare places (a character beyond the BMP escaped, a closing "..." after an open-ended
# plain scalar).
class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    def ignore_aliases(self, data) -> bool:
        """Never an anchor: a record's piece is dumped alone, so anchors would restart at
        &id001 in each, and a file with one anchor twice does not load (so lines with an
        anchor are never a write's: see read_changes)."""
        return True


def _str_presenter(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)
# libyaml's emitter changes the `...` state with block scalars alone (see Piece), so a piece
# without one needs no probe; with the Python emitter every piece is probed.
LIBYAML = _Dumper.__mro__[1] is not yaml.SafeDumper
_BREAKS = "\n\u2028\u2029\x85"  # line breaks libyaml writes as they are


def dump_yaml(data, dumper: type = _Dumper) -> str:
    """YAML in the order given (callers sort), block style, for clean git diffs."""
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)


@dataclass(frozen=True)
class Piece:
    """One record's lines in the file, and the `...` state after them: `after_closed` when
    the state before was closed, `after_open` when it was open (a piece with no block
    scalar leaves it as it was: False, True)."""

    text: str
    after_closed: bool = False
    after_open: bool = True


def make_piece(section: str, name: str, data: dict) -> Piece:
    """The piece of record `name` of `section` ("profiles" or "nodes")."""
    head = f"{section}:\n"
    alone = dump_yaml({section: {name: data}})[len(head):]
    if LIBYAML and "|" not in alone:  # no block scalar: the state passes through
        return Piece(alone)
    closer, opener = _sentinels(section)
    closed = dump_yaml({section: {name: data, _CLOSER: "x\ny"}})[len(head):]
    text = closed[:-len(closer)]  # the closing block scalar after it: never a `...`
    after_open = dump_yaml({section: {_OPENER: "\n", name: data}})[len(head):]
    return Piece(text, alone != text, after_open != opener + text)


_CLOSER, _OPENER = "x", "o"  # a record whose block scalar closes, one that leaves it open


def _sentinels(section: str) -> tuple[str, str]:
    head = f"{section}:\n"
    closer = dump_yaml({section: {_CLOSER: "x\ny"}})[len(head):]
    opener = dump_yaml({section: {_OPENER: "\n"}})[len(head):]
    return closer, opener.removesuffix(_END)


def sort_key(section: str):
    return node_sort_key if section == "nodes" else None


@dataclass
class Section:
    """One section's pieces (YAML, and JSON for the cache) with its names in file order."""

    names: list[str] = field(default_factory=list)
    keys: list = field(default_factory=list)
    yaml: dict[str, Piece] = field(default_factory=dict)
    json: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, section: str, records: dict[str, dict],
           pieces: dict[str, Piece] | None = None) -> "Section":
        """Pieces of every record (`pieces`: those already made, e.g. from the file)."""
        key = sort_key(section)
        names = sorted(records, key=key)
        made = pieces or {}
        return cls(names, [key(n) for n in names] if key else list(names),
                   {n: made.get(n) or make_piece(section, n, records[n]) for n in names},
                   {n: _json_piece(n, records[n]) for n in names})

    def changed(self, section: str, records: dict[str, dict | None]) -> "Section":
        """A copy with `records` (name -> data, None: removed) put in."""
        key = sort_key(section)
        names, keys = self.names, self.keys
        yaml_pieces, json_pieces = dict(self.yaml), dict(self.json)
        gone = {n for n, data in records.items() if data is None and n in yaml_pieces}
        new = [n for n, data in records.items() if data is not None and n not in yaml_pieces]
        if gone:
            kept = [i for i, n in enumerate(names) if n not in gone]
            names, keys = [names[i] for i in kept], [keys[i] for i in kept]
        if new:
            names, keys = list(names), list(keys)
            for name in new:
                at = bisect.bisect_left(keys, key(name) if key else name)
                names.insert(at, name)
                keys.insert(at, key(name) if key else name)
        for name, data in records.items():
            if data is None:
                yaml_pieces.pop(name, None)
                json_pieces.pop(name, None)
            else:
                yaml_pieces[name] = make_piece(section, name, data)
                json_pieces[name] = _json_piece(name, data)
        return Section(names, keys, yaml_pieces, json_pieces)

    def yaml_text(self, section: str, state: bool) -> tuple[str, bool]:
        """The section's lines, and the `...` state after them (`state` before)."""
        if not self.names:
            return f"{section}: {{}}\n", state
        parts = [f"{section}:\n"]
        for name in self.names:
            piece = self.yaml[name]
            parts.append(piece.text)
            state = piece.after_open if state else piece.after_closed
        return "".join(parts), state

    def json_text(self) -> str:
        return "{" + ",".join(self.json[n] for n in self.names) + "}"


def _json_piece(name: str, data: dict) -> str:
    return json.dumps(name) + ":" + json.dumps(data, separators=(",", ":"))


@dataclass
class Text:
    """The pieces of every record of one inventory."""

    sections: dict[str, Section]

    @classmethod
    def of(cls, data: dict, yaml_pieces: dict[str, dict[str, Piece]] | None = None
           ) -> "Text":
        return cls({s: Section.of(s, data[s], (yaml_pieces or {}).get(s)) for s in SECTIONS})

    def changed(self, records: dict[str, dict[str, dict | None]]) -> "Text":
        """A copy with the records changed: section -> name -> data (None: removed)."""
        return Text({s: self.sections[s].changed(s, records[s]) if records.get(s)
                     else self.sections[s] for s in SECTIONS})

    def yaml_text(self, head: str) -> str:
        """The file: `head` (the header comment, schema and revision lines), then each
        section; as dump_yaml of the whole inventory writes it."""
        parts, state = [head], False
        for section in SECTIONS:
            text, state = self.sections[section].yaml_text(section, state)
            parts.append(text)
        return "".join(parts) + (_END if state else "")

    def json_text(self, revision: int, digest: str, schema: int) -> str:
        """The JSON cache of the file whose sha256 is `digest`."""
        return (f'{{"sha256":{json.dumps(digest)},"data":{{"schema":{schema},'
                f'"revision":{revision},'
                f'"profiles":{self.sections["profiles"].json_text()},'
                f'"nodes":{self.sections["nodes"].json_text()}}},"canonical":{CANONICAL}}}')


CANONICAL = 1
"""Marks a JSON cache whose YAML was written by this module (the format of its pieces)."""

_KEY_LINE = re.compile(f"(?<=[{_BREAKS}])  (?=[^ ])")


def split_pieces(text: str, head: str, data: dict) -> dict[str, dict[str, Piece]] | None:
    """The pieces of a file this module wrote (`head` its first lines, `data` what it
    holds), read back from its text; None if its layout is not the one expected."""
    if not text.startswith(head):
        return None
    body = text[len(head):]
    found: dict[str, dict[str, Piece]] = {}
    for section, following in (("profiles", "nodes"), ("nodes", None)):
        names = sorted(data[section], key=sort_key(section))
        lines, body = _section_lines(body, section, following, bool(names))
        if lines is None:
            return None
        pieces = _pieces(section, lines, names, data[section]) if names else {}
        if pieces is None:
            return None
        found[section] = pieces
    return found if body in ("", _END) else None


def _section_lines(body: str, section: str, following: str | None, any_record: bool
                   ) -> tuple[str | None, str]:
    """(the record lines of `section` at the start of `body`, what follows them)."""
    if not any_record:
        empty = f"{section}: {{}}\n"
        return ("", body[len(empty):]) if body.startswith(empty) else (None, body)
    head = f"{section}:\n"
    if not body.startswith(head):
        return None, body
    end = len(body)
    if following is not None:
        end = _find_line(body, f"{following}:")
        if end < 0:
            return None, body
    lines = body[len(head):end]
    if following is None and lines.endswith(_END) and lines[-len(_END) - 1:][:1] in _BREAKS:
        lines, rest = lines[:-len(_END)], _END
    else:
        rest = body[end:]
    return lines, rest


def _find_line(body: str, start: str) -> int:
    """Where the first line starting with `start` (at column 0) begins, or -1."""
    match = re.search(f"(?<=[{_BREAKS}])" + re.escape(start) + r"(?=[ \n])", body)
    return match.start() if match else -1


def _pieces(section: str, lines: str, names: list[str], records: dict[str, dict]
            ) -> dict[str, Piece] | None:
    starts = [0] + [m.start() for m in _KEY_LINE.finditer(lines)]
    if len(starts) != len(names) or not lines.startswith("  "):
        return None
    pieces: dict[str, Piece] = {}
    for index, name in enumerate(names):
        text = lines[starts[index]:starts[index + 1] if index + 1 < len(starts) else None]
        if not (text.startswith(f"  {name}:") or text.startswith(f"  '{name}':")):
            return None
        piece = Piece(text) if LIBYAML and "|" not in text else make_piece(
            section, name, records[name])
        if piece.text != text:
            return None
        pieces[name] = piece
    return pieces


_REVISION = re.compile(r"revision: ([0-9]{1,18})\n")


def read_changes(text: str, head: str, kept: Text, load: Callable[[str], dict]
                 ) -> tuple[int, dict[str, dict[str, dict | None]]] | None:
    """A file this module wrote, read as its differences from the `kept` pieces of an
    earlier version: (its revision, section -> name -> data, None if removed). Only the
    records whose lines differ are parsed (`load`: YAML text to a mapping). None if the
    text is laid out otherwise (the caller then reads it whole); the caller checks that
    the pieces make the text again."""
    if not text.startswith(head):
        return None
    found = _REVISION.match(text, len(head))
    if found is None:
        return None
    body, changes = text[found.end():], {}
    for section, following in (("profiles", "nodes"), ("nodes", None)):
        empty = body.startswith(f"{section}: {{}}\n")
        lines, body = _section_lines(body, section, following, not empty)
        if lines is None:
            return None
        changes[section] = _changed_pieces(section, lines, kept.sections[section], load)
        if changes[section] is None:
            return None
    return (int(found.group(1)), changes) if body in ("", _END) else None


def _changed_pieces(section: str, lines: str, kept: Section, load: Callable[[str], dict]
                    ) -> dict[str, dict | None] | None:
    starts = [m.start() for m in _KEY_LINE.finditer(lines)]
    if lines and (not lines.startswith("  ") or starts[:1] == [0]):
        return None
    starts = [0] + starts if lines else []
    changes: dict[str, dict | None] = {}
    seen = set()
    for index, start in enumerate(starts):
        text = lines[start:starts[index + 1] if index + 1 < len(starts) else None]
        name = text[2:text.find(":")].strip("'")
        seen.add(name)
        piece = kept.yaml.get(name)
        if piece is not None and piece.text == text:
            continue
        record = load(f"{section}:\n{text}").get(section)
        if not isinstance(record, dict) or list(record) != [name]:
            return None
        changes[name] = record[name]
    changes.update((name, None) for name in kept.names if name not in seen)
    return changes
