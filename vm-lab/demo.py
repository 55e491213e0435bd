#!/usr/bin/env python3
"""The provisiond demo: lab up, build the tiny image, serve, PXE-boot 2 BIOS + 1 UEFI VMs to
`ready`, print each phase's time since the domain started, tear down (unless --keep)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from provisiond.errors import ProvisiondError  # noqa: E402
from pvlab import report  # noqa: E402
from pvlab.lab import LAB_FAILURES, Lab  # noqa: E402
from pvlab.layout import DEFAULT_DIR, DEFAULT_PLAN  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="vm-lab/demo.py", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="lab directory")
    parser.add_argument("--plan", default=DEFAULT_PLAN, help=f"nodes (default {DEFAULT_PLAN})")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to reach ready")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    return parser.parse_args(argv)


def step(what: str, func, *args):
    started = time.monotonic()
    print(f"==> {what}", flush=True)
    result = func(*args)
    print(f"    done in {time.monotonic() - started:.1f} s", flush=True)
    return result


def run(lab: Lab, timeout: float) -> int:
    step("lab up: namespace, libvirtd, domains, BMCs, inventory", lab.up, False)
    for image in sorted({node.image for node in lab.nodes.values()}):
        step(f"provisiond image build {image}", lab.build_image, image)
    step("provisiond overlay build", lab.build_overlays)
    step("provisiond serve (DHCP, TFTP, DNS, HTTP) in the namespace", lab.start_serve)
    step(f"power on {', '.join(lab.nodes)} (PXE)", lab.boot)
    statuses = step(f"wait for ready (up to {timeout:.0f} s)", lab.wait_ready, None, timeout)
    print(report.format_table(report.status_rows(lab, statuses)))
    failures = report.failure_report(lab, statuses)
    if failures:
        print(failures)
    return 1 if failures else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    lab = Lab(args.dir, args.plan)
    code = 1
    try:
        code = run(lab, args.timeout)
    except ProvisiondError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
    except LAB_FAILURES as exc:  # libvirt, a process, a file: one line, not a traceback
        print(f"demo: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
    finally:
        if args.keep:
            print("lab left up (--keep):\n" + report.describe(lab)
                  + f"\ntear it down with: python3 {HERE / 'lab.py'} --dir {args.dir} down")
        else:
            leftovers = step("lab down", lab.down)
            if leftovers:
                print(f"demo: left after teardown: {', '.join(leftovers)}", file=sys.stderr)
                code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
