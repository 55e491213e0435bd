"""`python -m provisiond.jobs run --state-dir DIR ID`: a job's runner (see runner.spawn)."""

from __future__ import annotations

import argparse
import logging
import sys

from provisiond.config import load_config
from provisiond.jobs.runner import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisiond.jobs")
    verbs = parser.add_subparsers(dest="verb", required=True)
    command = verbs.add_parser("run", help="run a pending job (started by provisiond.jobs)")
    command.add_argument("--state-dir", required=True)
    command.add_argument("id", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(load_config(args.state_dir), args.id)


if __name__ == "__main__":
    sys.exit(main())
