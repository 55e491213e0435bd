"""The HTTP API with 10,000 nodes: GET one node, a paginated listing of all, a change to SSE.

    python bench/bench_api.py [--nodes 10000] [--gets 1000] [--listings 3] [--changes 10]

`provisiond serve` (two workers, as shipped) on a loopback port, set up as bench_api_events.py
does (its helpers are reused). Measured, one after the other:
- GETS `GET /api/v1/nodes/NAME` of spread-out nodes, one at a time on one kept-alive
  connection with a reader token, after 20 unmeasured ones (a worker's first request loads
  the inventory): median and p99 (target p99 < 20 ms);
- LISTINGS walks of every node with `GET /api/v1/nodes?limit=1000` and its `continue` token:
  the total time of each walk (target < 2 s), its page count and node count checked;
- CHANGES inventory changes (a PATCH) reaching one SSE client (target < 1 s), as in
  bench_api_events.py.
There is no peer: the targets are absolute. Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api_events import WAIT, measure, percentile, prepare, start_serve, summary  # noqa: E402


def get_json(conn: http.client.HTTPConnection, token: str, path: str) -> dict:
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    answer = conn.getresponse()
    body = answer.read()
    if answer.status != 200:
        raise SystemExit(f"GET {path}: {answer.status} {body[:200]}")
    return json.loads(body)


def time_gets(port: int, token: str, nodes: int, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    times = []
    try:
        for i in range(count):
            name = f"n{1 + (i * 7919) % nodes}"
            started = time.perf_counter()
            document = get_json(conn, token, f"/api/v1/nodes/{name}")
            times.append(time.perf_counter() - started)
            assert document["name"] == name, document["name"]
    finally:
        conn.close()
    return times


def time_listing(port: int, token: str, nodes: int) -> tuple[float, int]:
    """(seconds to read every node page by page, pages read)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    seen, pages, cursor = 0, 0, None
    started = time.perf_counter()
    try:
        while pages <= nodes // 1000 + 1:
            path = "/api/v1/nodes?limit=1000" + (f"&continue={cursor}" if cursor else "")
            page = get_json(conn, token, path)
            seen, pages, cursor = seen + len(page["items"]), pages + 1, page["continue"]
            if not cursor:
                break
    finally:
        conn.close()
    elapsed = time.perf_counter() - started
    if seen != nodes:
        raise SystemExit(f"the listing returned {seen} nodes, not {nodes}")
    return elapsed, pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gets", type=int, default=1000)
    parser.add_argument("--listings", type=int, default=3)
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        port, tokens = prepare(state, args.nodes)
        proc = start_serve(state, port)
        try:
            print(f"{args.nodes} nodes; load average {os.getloadavg()[0]:.1f}")
            time_gets(port, tokens["reader"], args.nodes, 20)  # each worker's first loads
            gets = time_gets(port, tokens["reader"], args.nodes, args.gets)
            print(f"GET one node, {len(gets)} requests: {summary(gets)} "
                  f"(target p99 < 20 ms; p50 {percentile(gets, 0.5) * 1000:.1f} ms)")
            for _ in range(args.listings):
                seconds, pages = time_listing(port, tokens["reader"], args.nodes)
                print(f"listing of all {args.nodes} nodes in {pages} pages of 1000: "
                      f"{seconds:.2f} s (target < 2 s)")
            answers, found, lags = measure(port, tokens, 1, args.changes, args.nodes)
            print(f"change to 1 SSE client, {len(found)} changes: {summary(found)} "
                  f"(target < 1000 ms); PATCH answered {summary(answers)}; event emitted to "
                  f"client {summary(lags)}")
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
        finally:
            proc.terminate()  # serve stops its gunicorn
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
