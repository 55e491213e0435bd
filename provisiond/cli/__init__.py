"""The `provisiond` command: one small module per noun, each thin (parse, call, print)."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import select
import sys
import textwrap

from provisiond import __version__
from provisiond.errors import ExitCode, ProvisiondError, exit_code_table

# Nothing heavier is imported here: a Ctrl-C while this module imports is a traceback, one
# during main() is "interrupted" (the verbs' modules and the config load inside it).

# Each module has register(subparsers) that adds its noun(s) and sets `func` on the leaf
# parsers; func(args, ctx) returns an exit code (None means 0). Listed in `--help` order.
NOUN_MODULES = [
    "init", "node", "profile", "apply", "image", "overlay", "serve", "doctor",
    "power", "firmware", "job", "slurm", "discover", "secret", "token", "audit",
    "state", "completion", "man",
]


def exit_codes_help() -> str:
    """The exit-code table (provisiond.errors.ExitCode) for the `--help` epilog."""
    rows = (textwrap.fill(meaning, 79, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
            for code, meaning in exit_code_table())
    return "exit codes:\n" + "\n".join(rows)


# argparse's words for a value given to an option that takes none (`--insecure=false`)
_SWITCH_VALUE = re.compile(r"argument (\S+): ignored explicit argument (.*)")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line as every other error is (a bad value, a
    missing or stray word): its usage synopsis, eight lines for `image import`, hid the
    line that said what was wrong. Subcommands' parsers are of this class too."""

    def error(self, message: str):
        switch = _SWITCH_VALUE.fullmatch(message)
        if switch:
            message = (f"{switch[1]} takes no value, not {switch[2]}: give {switch[1]} "
                       "alone, or leave it out")
        command = self.prog.removeprefix("provisiond").strip()
        where = f"{command}: " if command else ""
        self.exit(_fail(f"{where}{message} (see `{self.prog} --help`)",
                        ExitCode.INVALID_INPUT))

    def parse_known_args(self, args=None, namespace=None):
        """A command's own parser (one without subcommands) refuses the words it did not
        take, naming itself: argparse left them to `provisiond`'s parser, whose error
        pointed at `provisiond --help`, which lists no option of the command. (Options of
        `provisiond` itself come before the command, as argparse reads them anyway.)"""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="provisiond",
        description="Stateless provisioning for HPC clusters: inventory, images, overlays, "
        "PXE boot services and BMC power control.",
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"provisiond {__version__}")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="state directory, made by `provisiond init` (default: $PROVISIOND_STATE_DIR "
        "or /var/lib/provisiond)",
    )
    subparsers = parser.add_subparsers(dest="noun", metavar="COMMAND")
    for name in NOUN_MODULES:
        importlib.import_module(f"provisiond.cli.{name}").register(subparsers)
    return parser


def open_standard_streams() -> None:
    """Give a process started with stdin, stdout or stderr closed /dev/null in their place.
    slurmctld closes every descriptor before it runs ResumeProgram and SuspendProgram: then
    sys.stdout is None (main()'s flush failed: exit 1 after the nodes were done), and the
    first file opened (the --log file) would become descriptor 0, 1 or 2, where a stray
    write to stdout or stderr lands."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return ExitCode.INVALID_INPUT
    try:
        code = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError as exc:
        if not _stdout_closed():
            return _fail(_os_error_text(exc), ExitCode.FAILED)
        _discard_stdout()
        return ExitCode.STDOUT_CLOSED


def _run(args) -> int:
    """The verb's exit code; errors become one line on stderr and their exit code."""
    from provisiond.cli.context import Context
    from provisiond.cli.ownership import as_state_owner, verb_kind

    try:
        ctx = Context(args.state_dir)
        with as_state_owner(ctx.state_dir, verb_kind(args)):  # root: as the dir's owner
            return args.func(args, ctx) or ExitCode.OK
    except ProvisiondError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        print("provisiond: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        raise  # main() tells a closed stdout from another broken pipe
    except OSError as exc:
        return _fail(_os_error_text(exc), ExitCode.FAILED)


def _os_error_text(exc: OSError) -> str:
    return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")


def _fail(message: str, code: int) -> int:
    from provisiond.cli.context import printable

    print(f"provisiond: error: {printable(message)}", file=sys.stderr)
    return code


def _stdout_closed() -> bool:
    """True when stdout is a pipe or socket whose reader has gone (POLLERR on the fd)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the final flush at exit neither fails nor prints."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def entry() -> None:
    """The console script: main(), and a Ctrl-C before its verb runs (while the parser is
    built and the verbs' modules import) ends as one during the verb does."""
    open_standard_streams()
    try:
        code = main()
    except KeyboardInterrupt:
        print("provisiond: interrupted", file=sys.stderr)
        code = ExitCode.INTERRUPTED
    sys.exit(code)
