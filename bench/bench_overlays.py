"""Overlay build benchmark: system overlays of N nodes (default 10,000), built in full,
again with nothing changed, and after one node's address changed.

    python bench/bench_overlays.py [--nodes 10000] [--keep DIR]

Targets (DESIGN.md section 8): full build < 20 s, one-node change < 1 s. The hosts overlay
lists every node, so an address change truly changes every node's /etc/hosts; hosts does
not read `node`, so it is in the shared part (built once), and the change rebuilds that one
shared part plus the changed node's own part. `--without-hosts` also runs the lists without
hosts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provisiond.config import load_config, write_default_config  # noqa: E402
from provisiond.inventory import InventoryStore  # noqa: E402
from provisiond.overlays import build_overlays  # noqa: E402

DEFAULT = ["init", "hostname", "hosts", "network", "agent"]


def write_inventory(state: Path, count: int, system: list[str]) -> None:
    nodes = {}
    for i in range(1, count + 1):
        host = i + 10
        nodes[f"n{i:05d}"] = {"profiles": ["compute"], "netdevs": {"eth0": {
            "mac": "52:54:%02x:%02x:%02x:%02x" % (i >> 24, (i >> 16) & 255, (i >> 8) & 255,
                                                  i & 255),
            "ipaddr": f"10.{(host >> 16) & 255}.{(host >> 8) & 255}.{host & 255}",
            "netmask": "255.0.0.0", "gateway": "10.0.0.1"}}}
    data = {"revision": 1, "profiles": {"compute": {
        "system_overlays": system, "runtime_overlays": ["ssh"]}}, "nodes": nodes}
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    (state / "inventory.yaml").write_text(yaml.dump(data, Dumper=dumper, sort_keys=False))


def timed(label: str, config, results: list) -> dict:
    started = time.perf_counter()
    summary = build_overlays(config, kinds=("shared", "system"))
    seconds = time.perf_counter() - started
    inventory = summary["inventory_seconds"]
    rebuilt, reused = summary["rebuilt"], summary["reused"]
    results.append((label, seconds, rebuilt["system"], reused["system"]))
    print(f"{label:<44} {seconds:6.2f} s (inventory {inventory:5.2f} s, overlays "
          f"{seconds - inventory:5.2f} s)  rebuilt {rebuilt['system']:>5} nodes "
          f"{rebuilt['shared']} shared  reused {reused['system']:>5} nodes "
          f"{reused['shared']} shared", flush=True)
    return summary


def scenario(state: Path, count: int, system: list[str], name: str, results: list) -> None:
    shutil.rmtree(state / "overlay-builds", ignore_errors=True)
    write_inventory(state, count, system)
    config = load_config(state)
    timed(f"{name}: full build", config, results)
    timed(f"{name}: nothing changed", config, results)
    change_one_address(config, f"n{count // 2:05d}")
    timed(f"{name}: one node's address changed", config, results)


def change_one_address(config, name: str) -> None:
    """What `provisiond node set NAME --ipaddr ...` does (not timed: the write, not the build)."""
    with InventoryStore(config).edit() as inventory:
        inventory.nodes[name].netdevs["eth0"].ipaddr = "10.255.255.254"


def print_sizes(state: Path, count: int) -> None:
    builds = state / "overlay-builds"
    own = sum(p.stat().st_size for p in builds.glob("*/system.*"))
    shared = sum(p.stat().st_size for p in builds.glob("_shared/*"))
    print(f"on disk: node parts {own / 1e6:.1f} MB for {count} nodes, shared parts "
          f"{shared / 1e6:.2f} MB", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--keep", help="state dir to use and keep (default: a temp dir)")
    parser.add_argument("--without-hosts", action="store_true",
                        help="also run the default lists without hosts")
    parser.add_argument("--c-yaml", action="store_true",
                        help="parse the inventory with libyaml (what store.py could do)")
    args = parser.parse_args()
    if args.c_yaml:
        yaml.safe_load = lambda text: yaml.load(text, Loader=yaml.CSafeLoader)
    state = Path(args.keep or tempfile.mkdtemp(prefix="bench-overlays-"))
    write_default_config(state)
    results: list = []
    try:
        scenario(state, args.nodes, DEFAULT, "default overlays", results)
        print_sizes(state, args.nodes)
        if args.without_hosts:
            without = [n for n in DEFAULT if n != "hosts"]
            scenario(state, args.nodes, without, "without hosts", results)
    finally:
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
