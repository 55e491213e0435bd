"""Overlay build benchmark: what a user runs. `provisiond overlay build` (the console entry
point, as a child process) for N nodes (default 10,000) of the shipped `default` profile,
from an empty state (runtime overlays and ssh host keys included), again with nothing
changed, then (--rounds times) after one node's address changed and after its comment
changed (checking the node's system and shared builds on disk carry the new address).
Wall and CPU seconds of each command are printed: on a shared machine the CPU time says
more about the command than the wall time.

    python bench/bench_overlays.py [--nodes 10000] [--keep DIR] [--keygen-sample 20]
                                   [--rounds 3]

Targets (DESIGN.md section 8, 2 cores): from empty < 60 s (goal < 20 s); one node changed
< 1 s. The nodes are made with `provisiond init` and `provisiond node add` (not timed). For
scale, the same run times `ssh-keygen` (what builds used before: RSA 3072 + ed25519 per node)
for a sample of nodes, and `provisiond --version` (the fixed cost of starting any command).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
TIMEOUT = 900  # seconds for any one command; the first build took over 15 min with RSA


def provisiond(state: Path, *args: str) -> tuple[float, float, str]:
    """Run the real entry point; (wall seconds, CPU seconds of it and its workers, stdout).
    A failure ends the benchmark."""
    command = VENV_BIN / "provisiond"
    argv = [str(command)] if command.exists() else [sys.executable, "-m", "provisiond"]
    before = _children_cpu()
    started = time.perf_counter()
    result = subprocess.run([*argv, "--state-dir", str(state), *args], capture_output=True,
                            text=True, timeout=TIMEOUT)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"provisiond {' '.join(args)} failed ({result.returncode}): "
                 f"{result.stderr.strip()}")
    return seconds, _children_cpu() - before, result.stdout


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_nodes(state: Path, count: int) -> None:
    provisiond(state, "init")
    last = f"n[{1:05d}-{count:05d}]"
    provisiond(state, "node", "add", last, "--profile", "default", "--mac",
               "52:54:00:10:00:01", "--ipaddr", "10.10.0.11", "--netmask", "255.255.0.0")


def build(state: Path, label: str, expect: dict) -> float:
    """One timed `overlay build --json`; checks the rebuilt counts are `expect`."""
    seconds, cpu, out = provisiond(state, "overlay", "build", "--json")
    summary = json.loads(out)
    rebuilt, reused = summary["rebuilt"], summary["reused"]
    print(f"{label:<30} {seconds:6.2f} s, CPU {cpu:6.2f} s (in-process {summary['seconds']:5.2f}"
          f" s, inventory {summary['inventory_seconds']:4.2f} s)  rebuilt shared/system/runtime "
          f"{rebuilt['shared']}/{rebuilt['system']}/{rebuilt['runtime']}, reused "
          f"{reused['shared']}/{reused['system']}/{reused['runtime']}", flush=True)
    if rebuilt != expect:
        sys.exit(f"{label}: expected rebuilt {expect}, got {rebuilt}")
    return seconds


def check_address(state: Path, node: str, address: str) -> None:
    """The builds on disk carry the node's new address (in its network files and in the
    one shared hosts file): the counts alone would not show a stale build."""
    from provisiond import archive
    from provisiond.config import load_config
    from provisiond.state.layout import Layout

    builds = Layout.of(load_config(state)).overlay_builds
    wanted = {"system": (next((builds / node).glob("system.cpio.*")), f"Address={address}/"),
              "shared": (_only(builds / "_shared"), f"{address}\t{node}.")}
    for kind, (path, text) in wanted.items():
        data = archive.unpack(archive.decompress(path.read_bytes()))
        if not any(text in e.data.decode(errors="replace") for e in data if not e.is_dir):
            sys.exit(f"{node}'s {kind} build {path} lacks {text!r}: stale")


def _only(folder: Path) -> Path:
    paths = list(folder.glob("*.cpio.*"))
    if len(paths) != 1:
        sys.exit(f"expected one shared build in {folder}, found {len(paths)}")
    return paths[0]


def keygen_seconds(sample: int) -> dict[str, float]:
    """Seconds per node for ssh-keygen of each type (the peer: what the build used to run)."""
    keygen = shutil.which("ssh-keygen", path="/usr/bin")
    if not keygen or sample <= 0:
        return {}
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key_type, extra in (("rsa", ["-b", "3072"]), ("ed25519", []), ("ecdsa", [])):
            started = time.perf_counter()
            for i in range(sample):
                subprocess.run([keygen, "-q", "-t", key_type, *extra, "-N", "", "-f",
                                f"{tmp}/{key_type}{i}"], check=True, timeout=120)
            result[key_type] = (time.perf_counter() - started) / sample
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--keep", help="state dir to use and keep (default: a temp dir)")
    parser.add_argument("--keygen-sample", type=int, default=20,
                        help="nodes to time ssh-keygen for (0: skip)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times to change one node and build again")
    args = parser.parse_args()
    state = Path(args.keep or tempfile.mkdtemp(prefix="bench-overlays-"))
    if args.keep and state.exists() and any(state.iterdir()):
        sys.exit(f"{state} is not empty")
    count = args.nodes
    print(f"{count} nodes, profile default, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at start", flush=True)
    try:
        make_nodes(state, count)
        start, cpu, _ = provisiond(state, "--version")
        print(f"{'provisiond --version':<30} {start:6.2f} s, CPU {cpu:6.2f} s", flush=True)
        all_nodes = {"shared": 1, "system": count, "runtime": count}
        build(state, "from empty (keys included)", all_nodes)
        build(state, "nothing changed", {"shared": 0, "system": 0, "runtime": 0})
        middle = f"n{max(1, count // 2):05d}"
        changed = []
        for round_ in range(1, args.rounds + 1):
            provisiond(state, "node", "set", middle, "--ipaddr", f"10.200.0.{round_}")
            changed.append(build(state, f"{middle}'s address changed",
                                 {"shared": 1, "system": 1, "runtime": 0}))
            check_address(state, middle, f"10.200.0.{round_}")
            provisiond(state, "node", "set", middle, "--comment", f"moved to rack {round_}")
            build(state, f"{middle}'s comment changed", {"shared": 0, "system": 0, "runtime": 0})
        print(f"one node's address changed: median {statistics.median(changed):.2f} s, best "
              f"{min(changed):.2f} s of {args.rounds}", flush=True)
        per_node = keygen_seconds(args.keygen_sample)
        for key_type, seconds in per_node.items():
            print(f"ssh-keygen -t {key_type:<8} {seconds * 1000:8.1f} ms a key, "
                  f"{seconds * count:7.1f} s for {count} nodes (from {args.keygen_sample})")
        print(f"load average at the end {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
