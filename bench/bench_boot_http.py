"""HTTP boot: iPXE scripts vs a bare Flask+Jinja route, and a 100 MB blob vs nginx-light.

provisiond runs as `provisiond serve` (HTTP only, logging at INFO); the bare app runs under
the same gunicorn command; wrk drives both over loopback. Prints req/s, p99 and MB/s with the ratios (targets: >= 1.0 with p99 < 50 ms;
>= 0.9 of nginx's aggregate MB/s with 50 concurrent downloads).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench_boot_common import (REPO, add_blob, add_image, command, free_port, mac_of,
                               make_state, serve, start, start_nginx, stop, up, wait_for)

SECONDS, NODES, ROUNDS = 10, 1000, 3
LUA = """local n, i = {count}, 0
request = function()
  i = i % n + 1
  return wrk.format("GET", string.format("/boot/ipxe/52:54:00:%02x:%02x:%02x",
                    (i >> 16) & 255, (i >> 8) & 255, i & 255))
end
"""


def wrk(url: str, connections: int, script: Path | None = None, seconds: int = SECONDS) -> dict:
    cmd = command(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency",
                   "--timeout", "30s"])
    out = subprocess.run([*cmd, *(["-s", str(script)] if script else []), url],
                         capture_output=True, text=True, timeout=SECONDS + 60).stdout
    print(out, file=sys.stderr)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p99": _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1)),
            "mbps": _mb(re.search(r"Transfer/sec:\s+([\d.]+\w+)", out).group(1)),
            "errors": "Non-2xx" in out or "Socket errors" in out}


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[unit]


def _mb(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"B": 1 / 2**20, "KB": 1 / 1024, "MB": 1, "GB": 1024}[unit]


def gunicorn(app_spec: str, port: int, state: Path) -> subprocess.Popen:
    from provisiond.boot.supervisor import gunicorn_command
    from provisiond.config import load_config

    cmd = gunicorn_command(load_config(state))[:-1] + ["--log-level", "warning", app_spec]
    cmd[cmd.index("--bind") + 1] = f"127.0.0.1:{port}"
    env = {"PROVISIOND_STATE_DIR": str(state), "PYTHONPATH": f"{REPO}:{REPO / 'bench'}"}
    return start(cmd, env=env, log=str(state / f"gunicorn-{port}.log"))


def setup_state(port: int) -> tuple[Path, str]:
    state = make_state(NODES, server={"address": "127.0.0.1"},
                       http={"bind": "127.0.0.1", "port": port})
    layer = add_blob(state, os.urandom(1 << 20), repeat=100)
    add_image(state, kernel=layer, layers=[layer, layer])
    return state, layer


def main() -> None:
    port_ours, port_bare, port_nginx = free_port(), free_port(), free_port()
    state, layer = setup_state(port_ours)
    lua = state / "macs.lua"
    lua.write_text(LUA.format(count=NODES))
    procs = [serve(state, "--http", "--no-dhcp", "--no-tftp", "--no-dns"),
             gunicorn("bench_boot_bare_app:app", port_bare, state),
             start_nginx(state / "nginx", port_nginx,
                         f"location /blobs/sha256/ {{ alias {state / 'blobs' / 'sha256'}/; }}")]
    base = {name: f"http://127.0.0.1:{port}" for name, port in
            (("ours", port_ours), ("bare", port_bare), ("nginx", port_nginx))}
    try:
        wait_for(lambda: all(up(f"{base[n]}/boot/ipxe/{mac_of(1)}") for n in ("ours", "bare"))
                 and up(f"{base['nginx']}/blobs/sha256/{layer}"))
        report(base, layer, lua)
    finally:
        for proc in procs:
            stop(proc)


def rounds(first: str, second: str, connections: int, script: Path | None) -> list:
    """ROUNDS alternating wrk runs of each URL (the machine is shared: alternate, take medians)."""
    return [(wrk(first, connections, script), wrk(second, connections, script))
            for _ in range(ROUNDS)]


def median(values) -> float:
    return statistics.median(values)


def report(base: dict, layer: str, lua: Path) -> None:
    for name in ("ours", "bare"):  # warm up: tables loaded, every node's first phase written
        wrk(f"{base[name]}/boot/ipxe/x", 50, lua, seconds=3)
    runs = rounds(f"{base['ours']}/boot/ipxe/x", f"{base['bare']}/boot/ipxe/x", 50, lua)
    ours, bare = median(r[0]["rps"] for r in runs), median(r[1]["rps"] for r in runs)
    print(f"ipxe script, 50 connections, median of {ROUNDS}: provisiond {ours:.0f} req/s (p99 "
          f"{median(r[0]['p99'] for r in runs):.1f} ms), bare Flask+Jinja {bare:.0f} req/s (p99 "
          f"{median(r[1]['p99'] for r in runs):.1f} ms), ratio {ours / bare:.2f} (target >= 1.0)")
    light = wrk(f"{base['ours']}/boot/ipxe/x", 8, lua)
    print(f"ipxe script, 8 connections: provisiond {light['rps']:.0f} req/s, p99 "
          f"{light['p99']:.1f} ms (target p99 < 50 ms)")
    url = f"/blobs/sha256/{layer}"
    runs = rounds(base["ours"] + url, base["nginx"] + url, 50, None)
    ours, peer = median(r[0]["mbps"] for r in runs), median(r[1]["mbps"] for r in runs)
    print(f"100 MB blob, 50 concurrent, median of {ROUNDS}: provisiond {ours:.0f} MB/s, nginx "
          f"{peer:.0f} MB/s, ratio {ours / peer:.2f} (target >= 0.9); per round: "
          + ", ".join(f"{r[0]['mbps']:.0f}/{r[1]['mbps']:.0f}" for r in runs))


if __name__ == "__main__":
    main()
