"""What every CLI verb gets: the config (loaded on first use) and output helpers.

Text from the inventory, status reports, BMCs, recipes and overlay files is untrusted: every
printer here passes it through `printable`, so no escape sequence reaches the terminal.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import re
import shutil
import sys
import unicodedata
from functools import cached_property
from pathlib import Path

import yaml

from provisiond.atomic import write_atomic
from provisiond.config import (CONFIG_NAME, SETTINGS_SCHEMA, Config, load_config, read_settings,
                               resolve_state_dir)
from provisiond.documents import SCHEMA_KEY, backup_path, load_yaml_mapping
from provisiond.errors import InvalidInput, StateDirNotFound
from provisiond.service.secrets import MAX_VALUE as MAX_SECRET
from provisiond.state.layout import Layout

# Control (Cc), format (Cf: bidi overrides, zero-width), surrogate, private-use and
# unassigned code points, and line/paragraph separators: none may reach a terminal raw.
UNPRINTABLE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


class Context:
    def __init__(self, state_dir_flag: str | None):
        self.state_dir = resolve_state_dir(state_dir_flag)

    @cached_property
    def config(self) -> Config:
        """The state dir's settings; a dir `init` never made is StateDirNotFound, so a
        mistyped path never becomes a new, empty cluster."""
        config = load_config(self.state_dir)  # valid, so migrating its file is safe
        layout = Layout.of(config)
        migrate_settings(layout.settings)
        if not layout.settings.is_file() and not layout.inventory.is_file():
            raise StateDirNotFound(
                f"no provisiond state in {self.state_dir} (no {CONFIG_NAME}, no inventory): "
                f"create one with `provisiond --state-dir {self.state_dir} init`, or name "
                "an existing one with --state-dir or $PROVISIOND_STATE_DIR")
        return config

    @staticmethod
    def read_secret(what: str) -> str:
        """A value from stdin, never from argv: one line at a terminal (a hidden prompt),
        else all of stdin without its last line end (a key file piped in stays whole)."""
        try:
            if sys.stdin.isatty():
                value = getpass.getpass(f"{what}: ")
            else:
                value = sys.stdin.read(MAX_SECRET + 1).removesuffix("\n").removesuffix("\r")
            value.encode()  # stdin read with surrogateescape (a C locale) keeps bad bytes
        except (UnicodeDecodeError, UnicodeEncodeError):
            raise InvalidInput(f"{what}: standard input is not valid UTF-8") from None
        except EOFError:  # Ctrl-D at the prompt
            raise InvalidInput(f"{what}: none given (end of input)") from None
        if not value:
            raise InvalidInput(f"{what}: read an empty value from stdin")
        if len(value) > MAX_SECRET:
            raise InvalidInput(f"{what}: more than {MAX_SECRET >> 10} KiB on stdin")
        return value

    @staticmethod
    def print_json(data) -> None:
        json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")

    @staticmethod
    def print_line(text: str, file=None) -> None:
        """One line of output, untrusted parts escaped (see `printable`)."""
        print(printable(text), file=file or sys.stdout)

    @staticmethod
    def print_table(columns: list[str], rows: list[list]) -> None:
        """A plain table that fits the terminal: the widest column is cut to fit; cells are
        escaped (see `printable`)."""
        cells = [[printable(str(c)) if c is not None else "-" for c in row] for row in rows]
        widths = [len(c) for c in columns]
        for row in cells:
            widths = [max(w, len(c)) for w, c in zip(widths, row)]
        room = shutil.get_terminal_size((120, 24)).columns
        overflow = sum(widths) + 2 * (len(widths) - 1) - room
        if overflow > 0:
            widest = widths.index(max(widths))
            widths[widest] = max(8, widths[widest] - overflow)
        print(_format_row(columns, widths))
        for row in cells:
            print(_format_row(row, widths))


def migrate_settings(path: Path) -> None:
    """Rewrite a provisiond.yaml of an older schema in the current one, the original kept
    beside it. A migration that changed no value only gets the `schema:` line (comments
    kept); otherwise the file is written anew (the backup has the comments). Best effort:
    a reader who may not write it still gets the migrated settings (load_config)."""
    text, data, version = read_settings(path)
    if version == SETTINGS_SCHEMA.current:
        return
    before = {k: v for k, v in load_yaml_mapping(text, str(path)).items() if k != SCHEMA_KEY}
    stamp = f"{SCHEMA_KEY}: {SETTINGS_SCHEMA.current}\n"
    if before == data:
        migrated = stamp + re.sub(rf"(?m)^{SCHEMA_KEY}:.*\n?", "", text)
    else:
        migrated = (f"# provisiond settings, migrated from schema {version}; as it was: "
                    f"{backup_path(path, version).name}\n{stamp}"
                    + yaml.safe_dump(data, sort_keys=False))
    with contextlib.suppress(OSError):
        write_atomic(backup_path(path, version), text)
        write_atomic(path, migrated)


def printable(text: str) -> str:
    """`text` with every character a terminal would act on written as an escape
    (`\\x1b`, `\\n`, `\\u202e`): untrusted text shows as text and never repaints the screen."""
    if text.isprintable():
        return text
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) in UNPRINTABLE_CATEGORIES
                   else ch for ch in text)


def _format_row(row: list[str], widths: list[int]) -> str:
    parts = []
    for cell, width in zip(row, widths):
        if len(cell) > width:
            cell = cell[: width - 1] + "…"
        parts.append(cell.ljust(width))
    return "  ".join(parts).rstrip()
