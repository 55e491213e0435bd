"""Start and stop the lab's long-running processes, always by PID, never by name. Programs
are found in this interpreter's bin dir (the venv's console scripts: sushy-emulator, vbmcd,
vbmc) or Debian's, never through whatever PATH the caller has."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pvlab.errors import LabError

_children: dict[int, subprocess.Popen] = {}  # daemons this process spawned, for exit codes
VENV_BIN = Path(sys.executable).parent  # not resolved: .venv/bin/python is a symlink
SEARCH_PATH = os.pathsep.join([str(VENV_BIN), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def find_tool(name: str) -> str | None:
    """Absolute path of program `name` in the venv or an apt directory, or None."""
    return shutil.which(name, path=SEARCH_PATH)


def tool(name: str) -> str:
    """Like find_tool, but a missing program is a LabError that says how to get it."""
    path = find_tool(name)
    if path is None:
        raise LabError(f"{name} is not installed (looked in {SEARCH_PATH}); "
                       "run .ci/install-deps.sh")
    return path


def run(argv: list[str], netns: str | None = None, check: bool = True,
        timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run a command to completion (inside `netns` if given); a failure raises LabError."""
    argv = in_netns(argv, netns)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise LabError(f"{' '.join(argv)}: exit {proc.returncode}: {detail[0]}")
    return proc


def in_netns(argv: list[str], netns: str | None) -> list[str]:
    """`argv` with its program made absolute (`ip netns exec` would search PATH for it)."""
    argv = [tool(argv[0]), *argv[1:]]
    return [tool("ip"), "netns", "exec", netns, *argv] if netns else argv


def spawn(argv: list[str], log: Path, netns: str | None = None, env: dict | None = None,
          cwd: Path | None = None) -> int:
    """Start a daemon in its own session with output to `log`; returns its PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(in_netns(argv, netns), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=env, cwd=cwd)
    _children[proc.pid] = proc
    return proc.pid


def exit_status(pid: int | None) -> str:
    """How a daemon this process spawned ended: 'exit N', 'signal N' or 'unknown'."""
    proc = _children.get(pid or 0)
    code = proc.poll() if proc else None
    if code is None:
        return "unknown"
    return f"signal {-code}" if code < 0 else f"exit {code}"


def alive(pid: int | None, marker: str = "") -> bool:
    """True if `pid` runs and its command line holds `marker` (guards against PID reuse).
    A daemon this process spawned is asked through its Popen instead: its pid cannot be
    reused before we reap it, and its command line reads empty for a moment while it execs
    (`ip netns exec` into bwrap), which made a serve just started look dead."""
    if not pid:
        return False
    if pid in _children:
        return _children[pid].poll() is None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and marker in cmdline


def stop(pid: int | None, marker: str = "", timeout: float = 10) -> None:
    """SIGTERM the process (and its session), then SIGKILL if it outlives `timeout`."""
    if not alive(pid, marker):
        return
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not alive(pid, marker):
            return
        time.sleep(0.1)
    _signal(pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap(pid)


def _signal(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll `predicate` until it returns a true value; LabError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
