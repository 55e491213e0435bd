"""A real systemd for unit tests of our units' semantics (what a restart or a failed start
does to the units depending on them), without systemd as the machine's PID 1: systemd runs as
PID 1 of pid, mount, UTS and cgroup namespaces the test makes, with its own /run, /dev (a
tmpfs with the few device nodes it needs: the host's /dev is not touched), /var/lib/systemd
and cgroup (a child of the test's own cgroup, removed after), its units only those of the
test's unit directory, bound on /etc/systemd/system (there, `systemctl is-enabled` sees
the links of its .wants directories as on a node). The network namespace is the host's:
its services reach a test's server on 127.0.0.1. Needs root, util-linux's unshare and
nsenter, cgroup v2."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.tools import tool

SYSTEMD = Path("/lib/systemd/systemd")
# what units with DefaultDependencies= and the agent's units name: empty stand-ins
TARGETS = ("sysinit", "basic", "shutdown", "local-fs", "local-fs-pre", "multi-user", "timers",
           "sockets", "paths", "slices", "network", "network-online", "swap")
SANDBOXES = itertools.count()
BOOT = """set -e
echo $$ > "$CGROUP/cgroup.procs"
exec unshare --cgroup sh -c '
set -e
mount -t tmpfs -o mode=755 run /run
mount -t proc proc /proc
mount -t tmpfs -o mode=755 dev /dev
for node in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
    set -- $node
    mknod -m 666 /dev/$1 c $2 $3
done
mkdir /dev/pts /dev/shm
ln -s /proc/self/fd /dev/fd
mount -t cgroup2 cgroup2 /sys/fs/cgroup
[ ! -d /var/lib/systemd ] || mount -t tmpfs tmpfs /var/lib/systemd
mount --bind "$UNITS" /etc/systemd/system
export SYSTEMD_UNIT_PATH=/etc/systemd/system container=provisiond-test
exec "$SYSTEMD" --system --unit=default.target
'
"""


def missing() -> str | None:
    """Why a SystemdSandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for name in ("unshare", "nsenter", "mknod"):
        if tool(name) is None:
            return f"{name} is not installed"
    if not SYSTEMD.exists() or not Path("/etc/systemd/system").is_dir():
        return "systemd is not installed"
    if _cgroup2_mount() is None:
        return "no cgroup v2 mounted"
    return None


def _cgroup2_mount() -> str | None:
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return fields[4]
    return None


def write_targets(units: Path) -> None:
    """Empty stand-ins for the standard targets (the sandbox's units are only the test's)."""
    for name in TARGETS:
        (units / f"{name}.target").write_text(f"[Unit]\nDescription=stand-in {name}\n")


class SystemdSandbox:
    """systemd booted on `units` (a directory with a default.target); stop() ends it."""

    def __init__(self, units: Path, log: Path):
        self.cgroup = Path(_cgroup2_mount() + _own_cgroup()) / (
            f"provisiond-test-{os.getpid()}-{next(SANDBOXES)}")
        self.cgroup.mkdir()
        env = dict(os.environ, CGROUP=str(self.cgroup), UNITS=str(units),
                   SYSTEMD=str(SYSTEMD))
        with open(log, "ab") as out:
            self.outer = subprocess.Popen(
                [tool("unshare"), "--pid", "--fork", "--mount", "--uts", "--propagation",
                 "private", "sh", "-c", BOOT], env=env, stdout=out, stderr=subprocess.STDOUT)
        self.pid = self._init_pid()
        self._wait_for_its_bus()
        self._wait_for_its_boot()

    def _init_pid(self) -> int:
        """The host PID of the namespace's PID 1 once it is systemd."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.outer.pid}/task/{self.outer.pid}/children")
            for pid in children.read_text().split() if children.exists() else []:
                try:
                    if os.readlink(f"/proc/{pid}/exe") == str(SYSTEMD.resolve()):
                        return int(pid)
                except OSError:
                    pass
            if self.outer.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("systemd did not start in the sandbox")

    def _wait_for_its_bus(self) -> None:
        deadline = time.monotonic() + 20
        while self.systemctl("is-system-running", check=False).stdout.strip() in ("", "offline"):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("systemd in the sandbox does not answer systemctl")
            time.sleep(0.05)

    def _wait_for_its_boot(self) -> None:
        """Until the boot's transaction is done (running, or degraded with a failed unit):
        its bus answers before the default target's jobs are queued, and a unit looked at
        then is inactive with no job queued, as if it had not been wanted."""
        done = self.systemctl("is-system-running", "--wait", check=False)
        if done.stdout.strip() not in ("running", "degraded"):
            self.stop()
            raise RuntimeError(f"systemd in the sandbox did not finish its boot: "
                               f"{done.stdout.strip() or done.stderr.strip()}")

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([tool("nsenter"), "-t", str(self.pid), "-m", "-p", "systemctl",
                               *args], capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"systemctl {' '.join(args)}: {done.stderr.strip()}")
        return done

    def show(self, unit: str, prop: str) -> str:
        return self.systemctl("show", "-p", prop, "--value", unit).stdout.strip()

    def wait_for(self, unit: str, states: set[str], timeout: float = 30) -> str:
        """The unit's ActiveState once it is one of `states` and no job of it is queued."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.show(unit, "ActiveState")
            if state in states and not self.systemctl("list-jobs", "--no-legend",
                                                      "--no-pager").stdout.strip():
                return state
            time.sleep(0.1)
        raise AssertionError(f"{unit} is {self.show(unit, 'ActiveState')}, not in {states}")

    def stop(self) -> None:
        """Kill the namespace's PID 1 (and so all in it), then remove its cgroup."""
        if getattr(self, "pid", None):
            proc, self.pid = Path(f"/proc/{self.pid}"), None
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
            deadline = time.monotonic() + 10
            while proc.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.outer.poll() is None:
            self.outer.kill()
        self.outer.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self.cgroup.exists() and time.monotonic() < deadline:
            for folder in sorted(self.cgroup.rglob("*"), key=lambda p: len(p.parts),
                                 reverse=True) + [self.cgroup]:
                if folder.is_dir():
                    try:
                        folder.rmdir()
                    except OSError:  # its processes not reaped yet
                        pass
            time.sleep(0.05)


def _own_cgroup() -> str:
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            if line.startswith("0::"):
                return line[3:].strip().rstrip("/")
    return ""
