"""TFTP: provisiond (`provisiond serve --tftp` as configured) vs tftpd-hpa, loopback, one run.

1. One 1 MB download with curl at blksize 1468, median of 20, the two servers alternating.
2. 200 curl clients at once, each from its own loopback address (as 200 nodes would be),
   each fetching the 1 MB file: wall time for all, median of 3 rounds, alternating.
Prints both servers' figures and the ratios (target <= 1.5).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_boot_common import command, free_port, make_state, serve, start, stop, wait_for

RUNS = 20
CLIENTS = 200
ROUNDS = 3
TFTPD = "/usr/sbin/in.tftpd"  # Debian's tftpd-hpa


def curl(port: int, out: Path, source: str = "127.0.0.1") -> list[str]:
    return command(["curl", "-sS", "--interface", source, "--tftp-blksize", "1468", "-o",
                    str(out), f"tftp://127.0.0.1:{port}/one.bin"])


def fetch(port: int, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run(curl(port, out), check=True, timeout=60)
    return time.perf_counter() - started


def fetch_all(port: int, outs: list[Path], expected: bytes) -> float:
    """CLIENTS downloads at once, client i from 127.0.1.i; seconds until the last is done."""
    started = time.perf_counter()
    procs = [subprocess.Popen(curl(port, out, f"127.0.{1 + i // 250}.{1 + i % 250}"))
             for i, out in enumerate(outs)]
    failed = sum(proc.wait(120) != 0 for proc in procs)
    elapsed = time.perf_counter() - started
    bad = sum(out.read_bytes() != expected for out in outs)
    assert not failed and not bad, f"{failed} clients failed, {bad} downloads differ"
    for out in outs:
        out.unlink()
    return elapsed


def ready(port: int, out: Path) -> bool:
    try:
        fetch(port, out)
        return True
    except subprocess.CalledProcessError:
        return False


def alternate(measure, ports: dict[str, int], rounds: int) -> dict[str, list[float]]:
    """`rounds` measurements per server, taking turns (the machine is shared)."""
    times: dict[str, list[float]] = {name: [] for name in ports}
    for _ in range(rounds):
        for name, port in ports.items():
            times[name].append(measure(port))
    return times


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="pvbench-tftp-"))
    root.chmod(0o755)  # tftpd-hpa drops to an unprivileged user
    data = os.urandom(1 << 20)
    (root / "one.bin").write_bytes(data)
    outs = Path(tempfile.mkdtemp(prefix="pvbench-tftp-out-"))
    out = outs / "out.bin"
    ports = {"provisiond": free_port(), "tftpd-hpa": free_port()}
    state = make_state(1, tftp={"enabled": True, "bind": "127.0.0.1",
                                "port": ports["provisiond"], "root": str(root)})
    ours = serve(state, "--no-http", "--tftp")
    peer = start([TFTPD, "-L", "-a", f"127.0.0.1:{ports['tftpd-hpa']}", "-s", str(root)])
    try:
        wait_for(lambda: all(ready(port, out) for port in ports.values()))
        single = alternate(lambda port: fetch(port, out), ports, RUNS)
        assert out.read_bytes() == data, "download differs"
        many = alternate(lambda port: fetch_all(
            port, [outs / f"{i}.bin" for i in range(CLIENTS)], data), ports, ROUNDS)
    finally:
        stop(ours)
        stop(peer)
    report(f"1 MB blksize 1468 (median of {RUNS})", single, 1000, "ms")
    report(f"{CLIENTS} clients x 1 MB at once (median of {ROUNDS})", many, 1, "s")


def report(what: str, times: dict[str, list[float]], scale: float, unit: str) -> None:
    """Medians and their ratio; each round too when there are few (how noisy the run was)."""
    ours, peer = (statistics.median(times[name]) for name in ("provisiond", "tftpd-hpa"))
    rounds = ""
    if len(times["provisiond"]) <= 5:
        rounds = "; rounds " + ", ".join(f"{a * scale:.2f}/{b * scale:.2f}" for a, b in
                                         zip(times["provisiond"], times["tftpd-hpa"]))
    print(f"tftp {what}: provisiond {ours * scale:.2f} {unit}, tftpd-hpa {peer * scale:.2f} "
          f"{unit}, ratio {ours / peer:.2f} (target <= 1.5){rounds}")


if __name__ == "__main__":
    main()
