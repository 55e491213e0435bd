"""The store's cost per call: put, compare-and-swap put and get on the files backend (the
state dir on this disk) and on a 3-member etcd cluster on loopback (tests/etcd_cluster.py),
medians of COUNT calls; then a put of a 10,000-node inventory.yaml (bench_storm's) and of a
value three times its size on etcd.

    .venv/bin/python bench/bench_store.py [--count 1000] [--nodes 10000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_boot_common import make_state  # noqa: E402

from provisiond.atomic import write_atomic  # noqa: E402
from provisiond.state.files import FilesStore  # noqa: E402
from provisiond.state.open import open_url  # noqa: E402
from tests.etcd_cluster import EtcdCluster  # noqa: E402

STATUS = json.dumps({"phase": "booting", "time": 1795000000.123, "address": "10.99.0.2",
                     "image": "tiny", "detail": "fetching layers"}, sort_keys=True).encode()


def median_ms(call, count: int) -> float:
    times = []
    for number in range(count):
        started = time.perf_counter()
        call(number)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(name: str, store, count: int) -> None:
    keys = [f"status/n{i}.json" for i in range(100)]
    put = median_ms(lambda n: store.put(keys[n % 100], STATUS), count)
    revisions = {entry.key: entry.revision for entry in store.list("status/")}

    def cas(n: int) -> None:
        key = keys[n % 100]
        revisions[key] = store.put(key, STATUS, expect=revisions[key])

    swap = median_ms(cas, count)
    get = median_ms(lambda n: store.get(keys[n % 100]), count)
    print(f"{name:6} put {put:6.2f} ms   compare-and-swap put {swap:6.2f} ms   "
          f"get {get:6.3f} ms   (medians of {count}, {len(STATUS)}-byte status values)",
          flush=True)


def _writer(root: str, kind: str, puts: int, number: int) -> None:
    store = FilesStore(Path(root))
    for index in range(puts):
        key = f"status/w{number}-{index % 50}.json"
        if kind == "store":
            store.put(key, STATUS)
        else:  # what status.py did before the store: one atomic file write, no lock
            write_atomic(Path(root) / key, STATUS)


def parallel(scratch: Path, kind: str, processes: int, puts: int) -> float:
    """Puts per second of `processes` writers at once (a boot storm's status reports)."""
    root = scratch / f"parallel-{kind}"
    FilesStore(root).put("status/first.json", STATUS)
    writers = [multiprocessing.Process(target=_writer, args=(str(root), kind, puts, n))
               for n in range(processes)]
    started = time.perf_counter()
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    return processes * puts / (time.perf_counter() - started)


def inventory(nodes: int) -> bytes:
    """bench_storm's inventory: `nodes` nodes with the shipped default profile."""
    from provisiond.config import SHIPPED_DIR

    profile = yaml.safe_load((SHIPPED_DIR / "profiles" / "default.yaml").read_text())
    state = make_state(nodes, profiles={"default": profile})
    try:
        return (state / "inventory.yaml").read_bytes()
    finally:
        shutil.rmtree(state.parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pvbench-store-") as scratch:
        measure("files", FilesStore(Path(scratch) / "state"), args.count)
        for round_ in range(2):  # alternated, the machine's load shifts
            for kind in ("store", "plain"):
                rate = parallel(Path(scratch) / str(round_), kind, 8, args.count // 5)
                what = "FilesStore.put" if kind == "store" else "write_atomic (before the store)"
                print(f"files  8 processes at once, {what}: {rate:.0f} puts/s", flush=True)
        with EtcdCluster(Path(scratch) / "etcd") as cluster:
            store = open_url(cluster.url("/bench"), Path(scratch) / "store.key")
            measure("etcd", store, args.count)
            value = inventory(args.nodes)
            put = median_ms(lambda n: store.put("inventory.yaml", value), 5)
            get = median_ms(lambda n: store.get("inventory.yaml"), 5)
            print(f"etcd   inventory.yaml of {args.nodes} nodes, {len(value) / 2**20:.2f} MiB: "
                  f"put {put:.0f} ms, get {get:.0f} ms (medians of 5)")
            richer = value * 3  # nodes with tags, BMCs, several interfaces
            put = median_ms(lambda n: store.put("inventory.yaml", richer), 5)
            print(f"etcd   a {len(richer) / 2**20:.2f} MiB value: put {put:.0f} ms (median of 5)",
                  flush=True)
            store.close()


if __name__ == "__main__":
    main()
