#!/usr/bin/env python3
"""The provisiond VM lab: `python3 vm-lab/lab.py up|down|status|boot` (run as root)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from provisiond.errors import ProvisiondError  # noqa: E402
from pvlab import report  # noqa: E402
from pvlab.lab import LAB_FAILURES, Lab  # noqa: E402
from pvlab.layout import DEFAULT_DIR, DEFAULT_PLAN  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="vm-lab/lab.py", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"lab directory (default {DEFAULT_DIR}, or $PVLAB_DIR)")
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up", help="bring the lab up (idempotent)")
    up.add_argument("--plan", default=DEFAULT_PLAN, help="nodes, e.g. n1:bios,n2:uefi:debian12")
    up.add_argument("--image", action="append", default=[], help="build this image too")
    up.add_argument("--no-serve", action="store_true", help="do not start provisiond serve")
    sub.add_parser("down", help="tear the lab down (idempotent)")
    sub.add_parser("status", help="the lab's parts and the nodes' boot phases")
    boot = sub.add_parser("boot", help="power nodes on from scratch (PXE) and wait for ready")
    boot.add_argument("names", nargs="*", help="nodes (default: all)")
    boot.add_argument("--timeout", type=float, default=180)
    boot.add_argument("--no-wait", action="store_true")
    return parser.parse_args(argv)


def cmd_up(lab: Lab, args) -> int:
    lab.up(serve=not args.no_serve)
    for image in args.image:
        print(f"built image {image} in {lab.build_image(image):.1f} s")
    if args.image:
        print(f"built overlays in {lab.build_overlays():.1f} s")
    print(report.describe(lab))
    return 0


def cmd_down(lab: Lab, _args) -> int:
    leftovers = lab.down()
    print("lab down" + (f"; still left: {', '.join(leftovers)}" if leftovers else ""))
    return 1 if leftovers else 0


def cmd_status(lab: Lab, _args) -> int:
    if not lab.netns:
        print("lab is down")
        return 1
    print(report.describe(lab))
    statuses = {name: lab.wait_ready([name], 0)[name] for name in lab.nodes}
    print(report.format_table(report.status_rows(lab, statuses)))
    return 0


def cmd_boot(lab: Lab, args) -> int:
    names = args.names or list(lab.nodes)
    lab.boot(names)
    if args.no_wait:
        return 0
    statuses = lab.wait_ready(names, args.timeout)
    print(report.format_table(report.status_rows(lab, statuses)))
    failures = report.failure_report(lab, statuses)
    if failures:
        print(failures)
    return 1 if failures else 0


COMMANDS = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "boot": cmd_boot}


def main(argv=None) -> int:
    args = parse_args(argv)
    lab = Lab(args.dir, getattr(args, "plan", DEFAULT_PLAN))
    try:
        return COMMANDS[args.verb](lab, args)
    except ProvisiondError as exc:
        print(f"vm-lab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except LAB_FAILURES as exc:  # libvirt, a process, a file: one line, not a traceback
        print(f"vm-lab: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vm-lab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
