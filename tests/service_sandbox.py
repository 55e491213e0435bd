"""Run a command as the shipped systemd unit runs `provisiond serve`, without systemd (the
test machines have no systemd as PID 1): the unit's options read from its text, so the unit
and what the tests run cannot drift apart. Its syntax is `systemd-analyze verify`'s job.

- setpriv (util-linux): the service's user and group (a uid the test picks), no
  supplementary groups, AmbientCapabilities as the only capabilities (inheritable, ambient,
  bounding set), NoNewPrivileges;
- bwrap (bubblewrap): the file system options: ProtectSystem=strict (all read-only but
  ReadWritePaths), PrivateTmp (a private /tmp and /var/tmp), PrivateDevices (a minimal
  /dev), ProtectHome (/home, /root, /run/user empty and read-only). ReadWritePaths are bound
  after the private /tmp, so a test's state dir under /var/tmp stays the real one.

An option value this emulation does not know fails the test: change both together.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
from pathlib import Path

from tests.tools import tool

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "provisiond" / "shipped" / "systemd" / "provisiond.service"
EMULATED = {"NoNewPrivileges": {"yes"}, "ProtectSystem": {"strict"}, "PrivateTmp": {"yes"},
            "PrivateDevices": {"yes"}, "ProtectHome": {"yes"}}


def unit_options(text: str | None = None) -> dict[str, list[str]]:
    """Every `Key=value` of the unit, values in order (a key may repeat)."""
    options: dict[str, list[str]] = {}
    for line in (text if text is not None else UNIT.read_text()).splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            options.setdefault(key.strip(), []).append(value.strip())
    return options


def capabilities(options: dict[str, list[str]]) -> list[str]:
    """The unit's ambient capabilities, as setpriv names them (net_bind_service)."""
    caps = " ".join(options.get("AmbientCapabilities", [])).split()
    bounding = " ".join(options.get("CapabilityBoundingSet", [])).split()
    assert sorted(caps) == sorted(bounding), "the emulation expects bounding = ambient"
    return [cap.removeprefix("CAP_").lower() for cap in caps]


def sandbox_argv(uid: int, gid: int, writable: list[Path], readable: list[Path] = (),
                 text: str | None = None) -> list[str]:
    """The prefix that runs a command under the unit's user, capabilities and file system
    options; `writable` are its ReadWritePaths as the test has them (a state dir),
    `readable` what else of a private /tmp or /var/tmp it must see (its interpreter)."""
    options = unit_options(text)
    for key, known in EMULATED.items():
        assert set(options.get(key, [])) <= known, f"{key}={options[key]} is not emulated"
    caps = ",".join(["-all", *(f"+{c}" for c in capabilities(options))])
    fs = [tool("bwrap"), "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
          "--perms", "1777", "--tmpfs", "/dev/shm", "--perms", "1777", "--tmpfs", "/tmp",
          "--perms", "1777", "--tmpfs", "/var/tmp"]  # as PrivateTmp's and /dev/shm are
    for hidden in ("/home", "/root", "/run/user"):
        if os.path.isdir(hidden):
            fs += ["--tmpfs", hidden, "--remount-ro", hidden]
    for path in [*readable, *writable]:
        fs += _parents(Path(path))
    for path in readable:
        fs += ["--ro-bind", str(path), str(path)]
    for path in writable:
        fs += ["--bind", str(path), str(path)]
    user = [tool("setpriv"), f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}",
            "--no-new-privs"]
    return [*fs, "--", *user, "--"]


def _parents(path: Path) -> list[str]:
    """0755 directories down to `path` inside the private /tmp or /var/tmp (bwrap would
    make them 0700: the service's user could not reach what is bound below)."""
    args = []
    for parent in reversed(path.parents):
        if any(parent.is_relative_to(t) and parent != Path(t) for t in ("/tmp", "/var/tmp")):
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


def service_python(folder: Path) -> Path:
    """An interpreter the service's user can run: this venv's lives under root's home
    (pyenv), which another user cannot enter. A venv of Debian's python3 (same 3.11 ABI)
    made in `folder`, seeing this venv's packages and this tree through a .pth file."""
    venv = folder / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print("
                              "sysconfig.get_paths()['purelib'])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    Path(purelib, "provisiond_tree.pth").write_text(
        f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")
    return venv / "bin" / "python"


def effective_capabilities(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff for pid {pid}")


def process_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])  # effective
    raise AssertionError(f"no Uid for pid {pid}")


def descendants(pid: int) -> list[int]:
    """pid's children, grandchildren... (gunicorn arbiters and workers of a serve)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:  # the task ended meanwhile
                continue
            found += children
            todo += children
    return found


def argv_of(pid: int) -> list[bytes]:
    """A process's argv ([] once it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []
