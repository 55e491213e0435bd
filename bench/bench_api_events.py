"""How long an inventory change takes to reach Server-Sent Events clients, with 10,000 nodes.

    python bench/bench_api_events.py [--nodes 10000] [--clients 1,100] [--changes 30]

`provisiond serve` (two workers, as shipped) on a loopback port; CLIENTS readers follow
`GET /api/v1/events?kinds=inventory.changed`; CHANGES times an admin client PATCHes one node
through the API. A change's latency at a client: from before the PATCH is sent to the
arrival of the `inventory.changed` event naming that node (the PATCH's own work included).
Target (DESIGN.md section 8): < 1 s. The changes are made one at a time, 0.2 s apart, so
each is measured from an idle stream (a stream notices a change by polling the journal file
every 0.15 s). Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

WAIT = 30.0  # at most this long for any one event or answer


def provisiond(state: Path, *args: str) -> str:
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state))
    done = subprocess.run([sys.executable, "-m", "provisiond", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"provisiond {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepare(state: Path, nodes: int) -> tuple[int, dict[str, str]]:
    provisiond(state, "init")
    provisiond(state, "node", "add", f"n[1-{nodes}]", "--ipaddr", "10.1.0.1", "--netmask",
               "255.255.0.0")
    port = free_port()
    config = yaml.safe_load((state / "provisiond.yaml").read_text()) or {}
    config["http"] = {**(config.get("http") or {}), "bind": "127.0.0.1", "port": port,
                      "event_streams": 1000}
    (state / "provisiond.yaml").write_text(yaml.safe_dump(config))
    tokens = {role: provisiond(state, "token", "create", "--role", role, "--name", role)
              for role in ("admin", "reader")}
    return port, tokens


def start_serve(state: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state))
    proc = subprocess.Popen([sys.executable, "-m", "provisiond", "serve"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit("serve did not listen")


class Follower(threading.Thread):
    """One SSE client: (node name, arrival time) of each inventory change it reads."""

    def __init__(self, port: int, token: str, arrivals: queue.Queue):
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        self.conn.request("GET", "/api/v1/events?kinds=inventory.changed",
                          headers={"Authorization": f"Bearer {token}"})
        self.response = self.conn.getresponse()
        if self.response.status != 200:
            raise SystemExit(f"events: {self.response.status} {self.response.read()[:200]}")
        self.arrivals = arrivals

    def run(self) -> None:
        try:
            while True:
                line = self.response.readline()
                if not line:
                    return
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    lag = time.time() - event["time"]  # from its emit to here
                    for name in event["data"].get("names", []):
                        self.arrivals.put((name, time.monotonic(), lag))
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return  # closed by close(), from the main thread

    def close(self) -> None:
        if self.conn.sock is not None:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def patch(port: int, token: str, node: str, value: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("PATCH", f"/api/v1/nodes/{node}", json.dumps({"tags": {"bench": value}}),
                     {"Authorization": f"Bearer {token}",
                      "Content-Type": "application/merge-patch+json"})
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise SystemExit(f"PATCH {node}: {answer.status} {body[:200]}")
    finally:
        conn.close()


def measure(port: int, tokens: dict, clients: int, changes: int, nodes: int
            ) -> tuple[list[float], list[float], list[float]]:
    """(PATCH answer times, change-to-client latencies, emit-to-client latencies)."""
    arrivals: queue.Queue = queue.Queue()
    followers = [Follower(port, tokens["reader"], arrivals) for _ in range(clients)]
    for follower in followers:
        follower.start()
    answers, latencies, lags = [], [], []
    try:
        for i in range(changes):
            node = f"n{1 + (i * 7919) % nodes}"
            sent = time.monotonic()
            patch(port, tokens["admin"], node, f"{clients}-{i}")
            answers.append(time.monotonic() - sent)
            for latency, lag in wait_for(arrivals, node, clients, sent):
                latencies.append(latency)
                lags.append(lag)
            time.sleep(0.2)
    finally:
        for follower in followers:
            follower.close()
    return answers, latencies, lags


def wait_for(arrivals: queue.Queue, node: str, clients: int, sent: float
             ) -> list[tuple[float, float]]:
    found, deadline = [], time.monotonic() + WAIT
    while len(found) < clients:
        name, when, lag = arrivals.get(timeout=max(0.01, deadline - time.monotonic()))
        if name == node:
            found.append((when - sent, lag))
    return found


def summary(values: list[float]) -> str:
    return (f"median {statistics.median(values) * 1000:.0f} ms, p99 "
            f"{percentile(values, 0.99) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--clients", default="1,100")
    parser.add_argument("--changes", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        port, tokens = prepare(state, args.nodes)
        proc = start_serve(state, port)
        try:
            print(f"{args.nodes} nodes, {args.changes} changes one at a time; load average "
                  f"{os.getloadavg()[0]:.1f}")
            for clients in (int(c) for c in args.clients.split(",")):
                answers, found, lags = measure(port, tokens, clients, args.changes,
                                               args.nodes)
                print(f"{clients:4d} client(s), {len(found)} arrivals: change to client "
                      f"{summary(found)} (target < 1000 ms); PATCH answered {summary(answers)}; "
                      f"event emitted to client {summary(lags)}")
        finally:
            proc.terminate()  # serve stops its gunicorn
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
