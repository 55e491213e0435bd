"""TFTP: a 1 MB download with curl (blksize 1468) from provisiond vs tftpd-hpa, loopback.

Prints the median times and the ratio (target <= 2.0).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_boot_common import free_port, make_state, serve, start, stop, wait_for

RUNS = 20


def fetch(port: int, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["curl", "-sS", "--tftp-blksize", "1468", "-o", str(out),
                    f"tftp://127.0.0.1:{port}/one.bin"], check=True, timeout=60)
    return time.perf_counter() - started


def median_time(port: int, out: Path, expected: bytes) -> float:
    times = [fetch(port, out) for _ in range(RUNS)]
    assert out.read_bytes() == expected, "download differs"
    return statistics.median(times)


def ready(port: int, out: Path) -> bool:
    try:
        fetch(port, out)
        return True
    except subprocess.CalledProcessError:
        return False


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="pvbench-tftp-"))
    root.chmod(0o755)  # tftpd-hpa drops to an unprivileged user
    data = os.urandom(1 << 20)
    (root / "one.bin").write_bytes(data)
    out = root / "out.bin"
    port_ours, port_peer = free_port(), free_port()
    state = make_state(1, tftp={"enabled": True, "bind": "127.0.0.1", "port": port_ours,
                                "root": str(root)})
    ours = serve(state, "--no-http", "--tftp")
    peer = start(["in.tftpd", "-L", "-a", f"127.0.0.1:{port_peer}", "-s", str(root)])
    try:
        wait_for(lambda: ready(port_ours, out) and ready(port_peer, out))
        t_peer = median_time(port_peer, out, data)
        t_ours = median_time(port_ours, out, data)
    finally:
        stop(ours)
        stop(peer)
    print(f"tftp 1 MB blksize 1468 (median of {RUNS}): provisiond {t_ours * 1000:.1f} ms, "
          f"tftpd-hpa {t_peer * 1000:.1f} ms, ratio {t_ours / t_peer:.2f} (target <= 2.0)")


if __name__ == "__main__":
    main()
