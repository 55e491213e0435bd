"""Power fan-out with hung BMCs: how long `provisiond power status` takes when some BMCs
never answer, against the two bounds that matter.

    python bench/bench_power_fanout.py [--nodes 50] [--hung 5] [--timeout 3] [--runs 3]

The nodes use the fake driver (`hang` never answers, the others answer at once), so only
provisiond's own fan-out is measured: the command as a user runs it, in a child process.
A fan-out where hung BMCs stall nobody ends after about one per-BMC deadline (plus the
grace of provisiond.power.fanout); one that waited for them in turn would need one deadline
per hung BMC. Target: within one deadline + 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from provisiond.config import write_default_config  # noqa: E402

TARGET_SLACK = 2.0


def provisiond(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state))
    return subprocess.run([sys.executable, "-m", "provisiond", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def prepare(state: Path, nodes: int, hung: int) -> None:
    write_default_config(state)
    live = nodes - hung
    for names, address in ((f"n[1-{live}]", "bmc"), (f"n[{live + 1}-{nodes}]", "hang")):
        result = provisiond(state, "node", "add", names, "--bmc-driver", "fake",
                            "--bmc-address", address)
        if result.returncode:
            raise SystemExit(result.stderr)


def timed_status(state: Path, nodes: int, timeout: float) -> tuple[float, list]:
    started = time.monotonic()
    result = provisiond(state, "power", "status", f"n[1-{nodes}]", "--timeout", str(timeout),
                        "--json")
    return time.monotonic() - started, json.loads(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--hung", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as work:
        state = Path(work) / "state"
        prepare(state, args.nodes, args.hung)
        times = []
        for _ in range(args.runs):
            seconds, rows = timed_status(state, args.nodes, args.timeout)
            failed = sum(row["result"] != "ok" for row in rows)
            if failed != args.hung:
                raise SystemExit(f"{failed} nodes failed, expected the {args.hung} hung ones")
            times.append(seconds)
    median = statistics.median(times)
    print(f"power status over {args.nodes} BMCs, {args.hung} hung, timeout {args.timeout:g} s: "
          f"median {median:.2f} s of {', '.join(f'{t:.2f}' for t in times)}")
    print(f"  bounds: one deadline {args.timeout:g} s; one per hung BMC in turn "
          f"{args.hung * args.timeout:g} s; target <= {args.timeout + TARGET_SLACK:g} s: "
          f"{'met' if median <= args.timeout + TARGET_SLACK else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
