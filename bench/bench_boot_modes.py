"""Mounted against unpacked layers in the VM lab: node n4 boots IMAGE both ways, one boot
after the other (who goes first alternates), ROUNDS times, and the bench prints each boot's
time to `ready`, where that time went (console steps timed on the host) and where the memory
went (the node's /proc/meminfo over ssh): the measurements of
tests/lab/test_mounted_layers_lab.py, here for any image and several rounds. Then the medians
and the ratios mounted/unpacked (issue 17's targets: time <= 0.6x, RAM in use <= 0.5x, where
in use is MemTotal - MemAvailable after `ready`). Run as root:

    .venv/bin/python bench/bench_boot_modes.py [--image debian12] [--rounds 3]
    .venv/bin/python bench/bench_boot_modes.py --image debian12-hpc --memory-mib 4096

`debian12-hpc` is this bench's own recipe (bench/images/debian12-hpc: debian12 plus compilers,
Open MPI, numeric Python and RDMA tools), for the comparison at a cluster image's size; the
bench puts bench/images/ on the lab's recipe path. The unpacked boot needs about twice the
image's expanded size in RAM (the initramfs and its tmpfs copy): give the node enough.
The lab is its own (/var/tmp/pvlab-bench-PID, or --lab-dir DIR whose state dir is kept for the
next run's layers), brought up and torn down by the bench.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "vm-lab")]

from tests.lab.test_mounted_layers_lab import (MODES, NODE, boot_measured,  # noqa: E402
                                               expanded_bytes, print_figures, set_boot_mode,
                                               set_memory)


def in_use_mib(result: dict) -> float:
    memory = result["memory"]
    return (memory["total_kib"] - memory["available_kib"]) / 1024


def summary(rounds: list[dict[str, dict]]) -> None:
    """Medians per mode and the mounted/unpacked ratios, each round's ratio beside."""
    ready = {mode: [r[mode]["times"]["ready"] for r in rounds] for mode in MODES}
    used = {mode: [in_use_mib(r[mode]) for r in rounds] for mode in MODES}
    print(f"\n{'':10} {'ready s (median)':>17} {'in use MiB (median)':>20}")
    for mode in MODES:
        print(f"{mode:10} {statistics.median(ready[mode]):17.1f} "
              f"{statistics.median(used[mode]):20.0f}")
    time_ratios = [m / u for m, u in zip(ready["mounted"], ready["unpacked"])]
    ram_ratios = [m / u for m, u in zip(used["mounted"], used["unpacked"])]
    print(f"mounted/unpacked time: median {statistics.median(time_ratios):.2f}x "
          f"(rounds: {', '.join(f'{r:.2f}' for r in time_ratios)}; target <= 0.6)")
    print(f"mounted/unpacked RAM in use: median {statistics.median(ram_ratios):.2f}x "
          f"(rounds: {', '.join(f'{r:.2f}' for r in ram_ratios)}; target <= 0.5)")


def add_bench_recipes(lab) -> None:
    """bench/images/<name>/ into the lab's state recipes dir (site recipes shadow shipped)."""
    from provisiond.state.layout import Layout

    recipes = Layout.of(lab.config).recipes
    for recipe in (ROOT / "bench" / "images").iterdir():
        if (recipe / "image.yaml").is_file():
            shutil.copytree(recipe, recipes / recipe.name, dirs_exist_ok=True)


def run(image: str, rounds: int, memory_mib: int | None, lab_dir: Path | None) -> None:
    from pvlab.lab import Lab

    lab = Lab(lab_dir or Path(f"/var/tmp/pvlab-bench-{os.getpid()}"), f"{NODE}:bios:{image}")
    try:
        lab.up(serve=False)
        add_bench_recipes(lab)
        if memory_mib:
            set_memory(lab, memory_mib)
        started = time.monotonic()
        lab.build_image(image)
        print(f"built {image} in {time.monotonic() - started:.0f} s: "
              f"{expanded_bytes(lab, image) / 2**20:.0f} MiB expanded; node memory "
              f"{lab.nodes[NODE].memory_mib} MiB")
        lab.build_overlays()
        lab.start_serve()
        results = []
        for index in range(rounds):
            order = MODES if index % 2 == 0 else MODES[::-1]
            results.append({mode: boot_measured(lab, mode) for mode in order})
            print(f"\nround {index + 1}:")
            print_figures({mode: results[-1][mode] for mode in MODES})
        summary(results)
    finally:
        set_boot_mode(lab, None)
        left = lab.down()
        if not lab_dir:  # a --lab-dir keeps its state dir: the next run reuses its layers
            shutil.rmtree(lab.state.state_dir, ignore_errors=True)
        if left:
            print(f"the lab left these behind: {', '.join(left)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="debian12")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-mib", type=int, help="the node's RAM (default: the lab's)")
    parser.add_argument("--lab-dir", type=Path, help="the lab's directory, kept after the run "
                        "so that the next run with it reuses the built layers (default: a new "
                        "/var/tmp/pvlab-bench-PID, removed)")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be 1 to 20")
    run(args.image, args.rounds, args.memory_mib, args.lab_dir)


if __name__ == "__main__":
    main()
