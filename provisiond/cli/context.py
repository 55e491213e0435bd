"""What every CLI verb gets: the config (loaded on first use) and output helpers."""

from __future__ import annotations

import getpass
import json
import shutil
import sys
from functools import cached_property

from provisiond.config import Config, load_config, resolve_state_dir
from provisiond.errors import InvalidInput


class Context:
    def __init__(self, state_dir_flag: str | None):
        self.state_dir = resolve_state_dir(state_dir_flag)

    @cached_property
    def config(self) -> Config:
        return load_config(self.state_dir)

    @staticmethod
    def read_secret(what: str) -> str:
        """One line from stdin (a hidden prompt on a terminal); never from argv."""
        if sys.stdin.isatty():
            value = getpass.getpass(f"{what}: ")
        else:
            value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            raise InvalidInput(f"{what}: read an empty value from stdin")
        return value

    @staticmethod
    def print_json(data) -> None:
        json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")

    @staticmethod
    def print_table(columns: list[str], rows: list[list]) -> None:
        """A plain table that fits the terminal: the widest column is cut to fit."""
        cells = [[str(c) if c is not None else "-" for c in row] for row in rows]
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


def _format_row(row: list[str], widths: list[int]) -> str:
    parts = []
    for cell, width in zip(row, widths):
        if len(cell) > width:
            cell = cell[: width - 1] + "…"
        parts.append(cell.ljust(width))
    return "  ".join(parts).rstrip()
