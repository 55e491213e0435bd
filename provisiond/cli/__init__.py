"""The `provisiond` command: one small module per noun, each thin (parse, call, print)."""

from __future__ import annotations

import argparse
import importlib
import sys

from provisiond import __version__
from provisiond.cli.context import Context
from provisiond.errors import ProvisiondError

# Each module has register(subparsers) that adds its noun(s) and sets `func` on the leaf
# parsers; func(args, ctx) returns an exit code (None means 0). Listed in `--help` order.
NOUN_MODULES = [
    "init", "node", "profile", "apply", "image", "overlay", "serve",
    "power", "firmware", "slurm", "secret",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provisiond",
        description="Stateless provisioning for HPC clusters: inventory, images, overlays, "
        "PXE boot services and BMC power control.",
    )
    parser.add_argument("--version", action="version", version=f"provisiond {__version__}")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="state directory (default: $PROVISIOND_STATE_DIR or /var/lib/provisiond)",
    )
    subparsers = parser.add_subparsers(dest="noun", metavar="COMMAND")
    for name in NOUN_MODULES:
        importlib.import_module(f"provisiond.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    ctx = Context(args.state_dir)
    try:
        return args.func(args, ctx) or 0
    except ProvisiondError as exc:
        print(f"provisiond: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("provisiond: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"provisiond: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 1


def entry() -> None:
    sys.exit(main())
