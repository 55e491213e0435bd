"""Build many nodes' overlays at once, in parallel across cores (a forked process pool).

The builder (inventory snapshot, compiled templates) is made once in the parent and
inherited by the forked workers, so nothing is re-read or re-compiled per node. Shared
builds are few (one per distinct overlay list and image): the parent builds each once.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

from provisiond.config import Config
from provisiond.errors import BuildFailed, NodeNotFound, ProvisiondError
from provisiond.events import build_events
from provisiond.inventory.ranges import names_text
from provisiond.overlays.build import build_node, is_built, output_path, remove_unused_shared
from provisiond.overlays.context import Snapshot, take_snapshot
from provisiond.overlays.hostkeys import sync_new_keys
from provisiond.overlays.render import KINDS, Builder

IN_PROCESS_LIMIT = 64  # below this many nodes a pool costs more than it saves
_WORKER_BUILDER: Builder | None = None
_WORKER_SKIP: frozenset[str] = frozenset()  # nodes whose "system" part is not built


class OverlayBuildFailed(BuildFailed):
    """Some nodes' overlays failed to build; their previous builds stay in place."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


def build_overlays(config: Config, names: list[str] | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   kinds: tuple[str, ...] = KINDS) -> dict:
    """Build the named nodes' (default: all) stale overlays (checked here; only stale nodes
    go to the worker processes); "system" in `kinds` implies "shared". Returns a summary:
    {"nodes", "rebuilt": {kind: n}, "reused": {kind: n}, "failed": {node: error}, "seconds",
    "inventory_seconds" (of those seconds, reading and merging the inventory)}; the shared
    counts are of distinct shared builds, the others of nodes.
    Raises OverlayBuildFailed (carrying the summary) when any node failed."""
    started = time.monotonic()
    target = names_text(names, "node") if names else "all"
    with build_events(config, f"overlays/{target}", {"what": "overlays", "nodes": target}
                      ) as outcome:
        with _collector_paused():
            snapshot = take_snapshot(config, reuse=False)
        read = time.monotonic() - started
        summary = _build(config, snapshot, names, progress, kinds, started, read)
        outcome.update({key: summary[key] for key in ("rebuilt", "reused", "seconds")})
    return summary


@contextlib.contextmanager
def _collector_paused():
    """Reading 10,000 nodes makes about a million long-lived objects: the cyclic collector's
    passes over them while they are made find nothing to free and cost ~0.2 s (a third of
    an unchanged build's own time). Off meanwhile; then they are frozen out of later passes
    (which also keeps the forked workers from copying their pages). They stay frozen: batch
    builds run in a CLI process that exits next, and the collector's pass over them at exit
    cost another ~0.3 s; frozen objects are still freed when no longer referenced."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.freeze()


def _build(config, snapshot, names, progress, kinds, started: float, read: float) -> dict:
    full = names is None
    names = _check_names(snapshot, names)
    builder = Builder(config, snapshot, durable_secrets=False)
    kinds = _with_shared(kinds)
    node_kinds = tuple(k for k in kinds if k != "shared")
    results = _build_shared(builder, names, full) if "shared" in kinds else []
    unshared = frozenset(r[0] for r in results if r[2] not in ("rebuilt", "reused"))
    stale = [n for n in names if not all(is_built(builder, n, k) for k in node_kinds)]
    results += [(n, k, "reused") for n in set(names) - set(stale) for k in node_kinds]
    results += _run(builder, stale, node_kinds, progress, _worker_count(config), unshared)
    if "runtime" in node_kinds and stale:
        sync_new_keys()  # before anyone is told the build is done
    summary = _summarise(names, kinds, results, time.monotonic() - started)
    summary["inventory_seconds"] = round(read, 3)
    if summary["failed"]:
        first = next(iter(summary["failed"].values()))
        count = len(summary["failed"])
        raise OverlayBuildFailed(f"{first}" + (f" (and {count - 1} more nodes failed)"
                                               if count > 1 else ""), summary)
    return summary


def _check_names(snapshot: Snapshot, names: list[str] | None) -> list[str]:
    if names is None:
        return snapshot.names
    missing = [n for n in names if n not in snapshot.nodes]
    if missing:
        raise NodeNotFound(f"no node named {missing[0]!r}")
    return list(names)


def _with_shared(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds in KINDS order, with "shared" when "system" is asked for (a node boots both)."""
    wanted = set(kinds) | ({"shared"} if "system" in kinds else set())
    return tuple(k for k in KINDS if k in wanted)


def _build_shared(builder: Builder, names: list[str], full: bool) -> list[tuple]:
    """Build each distinct shared part of `names` once (in this process); after a full
    build without failures, remove the shared parts no node uses any more."""
    groups: dict[str, list[str]] = {}
    results = []
    for name in names:
        try:
            groups.setdefault(builder.node_key(name, "shared"), []).append(name)
        except ProvisiondError as exc:
            results.append((name, "shared", str(exc)))
    for members in groups.values():
        try:
            state = "rebuilt" if build_node(builder, members[0], "shared") else "reused"
            results.append((members[0], "shared", state))
        except ProvisiondError as exc:
            results += [(name, "shared", str(exc)) for name in members]
    if full and all(r[2] in ("rebuilt", "reused") for r in results):
        keep = {output_path(builder.config, builder, m[0], "shared") for m in groups.values()}
        remove_unused_shared(builder.config, keep)
    return results


def _worker_count(config: Config) -> int:
    return config.build.workers or len(os.sched_getaffinity(0))


def _build_chunk(names: list[str], kinds: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(node, kind, "rebuilt" | "reused" | error text) for each node and kind; a node whose
    shared part failed gets no new "system" part (it boots both: the node's failure is the
    shared one's, as a failed node part of its own leaves the previous build in place)."""
    results = []
    for name in names:
        for kind in kinds:
            if kind == "system" and name in _WORKER_SKIP:
                continue
            try:
                state = "rebuilt" if build_node(_WORKER_BUILDER, name, kind) else "reused"
            except ProvisiondError as exc:
                state = str(exc)
            results.append((name, kind, state))
    return results


def _run(builder, names, kinds, progress, workers,
         unshared: frozenset[str] = frozenset()) -> list[tuple[str, str, str]]:
    """Build `names` with the builder inherited by forked workers (dropped afterwards, so
    the snapshot it holds is freed with the next one); `unshared`: the nodes whose shared
    part failed (their "system" part is not built)."""
    global _WORKER_BUILDER, _WORKER_SKIP
    _WORKER_BUILDER, _WORKER_SKIP = builder, unshared
    try:
        return _run_chunks(names, kinds, progress, workers)
    finally:
        _WORKER_BUILDER, _WORKER_SKIP = None, frozenset()


def _run_chunks(names, kinds, progress, workers) -> list[tuple[str, str, str]]:
    total, done, results = len(names), 0, []
    size = max(1, min(250, total // (workers * 8) or 1))
    chunks = [names[i:i + size] for i in range(0, total, size)]
    if workers <= 1 or total < IN_PROCESS_LIMIT:
        for chunk in chunks:
            results += _build_chunk(chunk, kinds)
            done += len(chunk)
            progress and progress(done, total)
        return results
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_build_chunk, chunk, kinds): len(chunk) for chunk in chunks}
        for future in as_completed(futures):
            results += future.result()
            done += futures[future]
            progress and progress(done, total)
    return results


def _summarise(names, kinds, results, seconds: float) -> dict:
    summary = {"nodes": len(names), "rebuilt": {k: 0 for k in kinds},
               "reused": {k: 0 for k in kinds}, "failed": {}, "seconds": round(seconds, 3)}
    for name, kind, state in results:
        if state in ("rebuilt", "reused"):
            summary[state][kind] += 1
        else:
            summary["failed"].setdefault(name, state)
    return summary
