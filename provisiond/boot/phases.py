"""Phase records kept off the servers' hot paths.

`record_phase` locks, rewrites and fsyncs a file: too slow for a loop answering thousands of
DHCP packets a second. `provisiond serve` starts one writer process
(`python -m provisiond.boot.phases STATE`); the DHCP loop and every HTTP worker write lines
into its pipe, so the writes cost them neither time nor the GIL. Without serve (tests, a
bare gunicorn) an HTTP worker uses a writer thread. Repeats within `quiet` s are dropped.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from provisiond.config import Config, load_config
from provisiond.errors import ProvisiondError
from provisiond.states import NodePhase

log = logging.getLogger("provisiond.boot")
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PHASE_FD_ENV = "PROVISIOND_PHASE_FD"


class _Recorder:
    def __init__(self, config: Config, quiet: float):
        self.config = config
        self.quiet = quiet
        self._last: dict[tuple[str, str], float] = {}

    def record(self, node: str, phase: NodePhase, detail: str = "") -> bool:
        """Queue `phase` for `node` unless it was queued within `quiet` s; True if queued."""
        now = time.monotonic()
        key = (node, phase.value)
        if now - self._last.get(key, -1e9) < self.quiet:
            return False
        if len(self._last) > 200_000:
            self._last.clear()
        self._last[key] = now
        return self._send(node, phase, detail, time.time())

    def _send(self, node: str, phase: NodePhase, detail: str, at: float) -> bool:
        raise NotImplementedError


class PhaseRecorder(_Recorder):
    """One writer thread per process (the HTTP workers)."""

    def __init__(self, config: Config, quiet: float = 2.0):
        super().__init__(config, quiet)
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._thread = threading.Thread(target=self._run, name="phase-writer", daemon=True)
        self._thread.start()

    def _send(self, node: str, phase: NodePhase, detail: str, at: float) -> bool:
        try:
            self._queue.put_nowait((node, phase, detail, at))
            return True
        except queue.Full:
            log.warning("phase queue full, dropped %s %s", node, phase.value)
            return False

    def flush(self) -> None:
        """Wait until every queued phase is written."""
        self._queue.join()

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                write_phase(self.config, *item)
            finally:
                self._queue.task_done()


class PhasePipe(_Recorder):
    """Writes phase lines into the writer process's pipe; any process holding its fd may
    (the DHCP loop, every HTTP worker: lines under PIPE_BUF never interleave)."""

    def __init__(self, config: Config, fd: int, quiet: float = 2.0):
        super().__init__(config, quiet)
        self.fd = fd
        self.dropped = 0

    def _send(self, node: str, phase: NodePhase, detail: str, at: float) -> bool:
        line = f"{node}\t{phase.value}\t{at:.6f}\t{detail[:200]}".replace("\n", " ") + "\n"
        try:
            os.write(self.fd, line.encode())  # < PIPE_BUF: written whole or not at all
            return True
        except OSError as exc:  # behind (EAGAIN) or gone (EPIPE): answering comes first
            self.dropped += 1
            if self.dropped & (self.dropped - 1) == 0:  # 1st, 2nd, 4th... drop
                log.warning("phase writer %s: %d phase records dropped",
                            "behind" if isinstance(exc, BlockingIOError) else "gone",
                            self.dropped)
            return False


class PhaseProcess(PhasePipe):
    """Starts the low-priority writer process behind a large non-blocking pipe: under a
    burst of boots it lags behind and catches up, the answers never wait for it."""

    def __init__(self, config: Config, quiet: float = 5.0):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "provisiond.boot.phases", str(config.state_dir)],
            stdin=subprocess.PIPE, env=env)
        super().__init__(config, self._proc.stdin.fileno(), quiet)
        os.set_blocking(self.fd, False)
        try:
            fcntl.fcntl(self.fd, F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: keep the default

    def close(self, timeout: float = 10.0) -> None:
        """EOF for the writer once every holder of the pipe (gunicorn) has exited; once."""
        if self._proc.stdin.closed:
            return
        os.set_blocking(self.fd, True)
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def recorder_from_env(config: Config) -> _Recorder:
    """The pipe `provisiond serve` passed down ($PROVISIOND_PHASE_FD), else a writer thread."""
    fd = os.environ.get(PHASE_FD_ENV)
    if fd and fd.isdigit():
        return PhasePipe(config, int(fd))
    return PhaseRecorder(config)


def write_phase(config: Config, node: str, phase: NodePhase, detail: str,
                at: float | None = None) -> None:
    from provisiond.status import record_phase

    try:
        record_phase(config, node, phase, detail, at=at)
    except (OSError, ProvisiondError) as exc:  # the store away, a file in the way...
        log.error("cannot record phase %s for %s: %s", phase.value, node, exc)
    except Exception:  # a bug: logged whole; the writer goes on with the next phase
        log.exception("cannot record phase %s for %s", phase.value, node)


def main(state_dir: str) -> None:
    """The writer process: one `node<TAB>phase<TAB>time<TAB>detail` line per phase on
    stdin (time: when the request came, seconds since the epoch)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the parent
    os.nice(10)  # answering packets comes first; the records catch up after a burst
    config = load_config(Path(state_dir))
    for raw in sys.stdin.buffer:
        parts = raw.decode(errors="replace").rstrip("\n").split("\t", 3)
        if len(parts) == 4 and parts[1] in NodePhase._value2member_map_:
            write_phase(config, parts[0], NodePhase(parts[1]), parts[3], _time(parts[2]))


def _time(text: str) -> float | None:
    try:
        at = float(text)
    except ValueError:
        return None
    return at if math.isfinite(at) else None


if __name__ == "__main__":
    main(sys.argv[1])
