"""`provisiond man`: the man page (roff), generated from the parser: every command with its
description and options, the exit codes, the environment and files."""

from __future__ import annotations

import datetime
import re

from provisiond import __version__
from provisiond.cli.commands import Command, takes_value, walk
from provisiond.errors import exit_code_table


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "man", help="print the man page (roff)",
        description="Print provisiond(8), generated from this command's own parser: "
        "`provisiond man > /usr/local/share/man/man8/provisiond.8`, or read it with "
        "`provisiond man | man -l -`.")
    parser.set_defaults(func=run)


def run(args, ctx) -> None:
    from provisiond.cli import build_parser

    print(man_page(build_parser()), end="")


def man_page(parser) -> str:
    commands = walk(parser)
    top = commands[0]
    date = datetime.date.today().isoformat()
    lines = [f'.TH PROVISIOND 8 "{date}" "provisiond {__version__}" "System Administration"',
             ".SH NAME", r"provisiond \- " + _text(parser.description or ""),
             ".SH SYNOPSIS", r".B provisiond", r"[\fB\-\-state\-dir\fR \fIDIR\fR]",
             r"\fICOMMAND\fR [\fIARGS\fR...]", ".SH OPTIONS", *_options(top),
             ".SH COMMANDS"]
    for command in commands[1:]:
        lines += _command(command)
    lines += [".SH EXIT STATUS"]
    for code, meaning in exit_code_table():
        lines += [".TP", f".B {code}", _text(meaning)]
    lines += [".SH ENVIRONMENT", ".TP", ".B PROVISIOND_STATE_DIR",
              "The state directory when \\fB\\-\\-state\\-dir\\fR is not given.",
              ".SH FILES", ".TP", ".I /var/lib/provisiond/provisiond.yaml",
              "Settings, written with comments by \\fBprovisiond init\\fR.", ".TP",
              ".I /var/lib/provisiond/inventory.yaml", "Nodes and profiles.", ".TP",
              ".I /etc/systemd/system/provisiond.service",
              "The unit \\fBprovisiond init \\-\\-systemd\\fR writes."]
    return "\n".join(lines) + "\n"


def _command(command: Command) -> list[str]:
    usage = " ".join(command.words)
    args = " ".join(_positional(a) for a in command.positionals)
    lines = [".SS " + _text(f"{usage} {args}".strip())]
    about = command.parser.description or command.help
    if about:
        lines.append(_text(about))
    return lines + _options(command)


def _options(command: Command) -> list[str]:
    lines = []
    for action in command.options:
        if action.help == "==SUPPRESS==" or "-h" in action.option_strings:
            continue
        flags = ", ".join(f"\\fB{_text(flag)}\\fR" for flag in action.option_strings)
        if takes_value(action):
            flags += f" \\fI{_text(action.metavar or action.dest.upper())}\\fR"
        lines += [".TP", flags, _text((action.help or "").replace("%(default)s",
                                                                  str(action.default)))]
    return lines


def _positional(action) -> str:
    name = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
    return f"[{name}]" if action.nargs in ("?", "*") else str(name)


def _text(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line starting with a dot or
    a quote (a request), no blank line."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"\s+", " ", text).strip()
    return "\\&" + text if text.startswith((".", "'")) else text
