"""Slurm's server side in the lab: munged and slurmctld inside the lab namespace, with their
config, state, logs and munge socket under the lab dir (`<lab>/slurm/`), started and stopped
by PID.

Every Slurm program (slurmctld, sinfo, srun, sbatch, scontrol) finds munged at the socket
path compiled in (/run/munge/munge.socket.2) unless slurm.conf says another (AuthInfo), and
slurm.conf is the one file the nodes get too, where munged listens at that default. So the
lab's munged listens under the lab dir, and each Slurm program runs in a mount namespace of
its own (`unshare --mount`) where a private tmpfs on /run links the default path to that
socket: nothing on the host changes. That namespace also has its own host name
(`unshare --uts`): slurmctld runs only on the host slurm.conf's SlurmctldHost names.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import yaml

from pvlab import process
from pvlab.errors import LabError
from pvlab.layout import SERVER_ADDRESS, LabState

CONTROLLER = "pvlab-ctl"
"""SlurmctldHost's name: the host name slurmctld runs under (its UTS namespace)."""
MUNGE_DEFAULT_SOCKET = "/run/munge/munge.socket.2"
MUNGE_KEY_SECRET = "munge.key"


def slurm_dir(state: LabState) -> Path:
    return state.dir / "slurm"


def munge_socket(state: LabState) -> Path:
    """In a folder of its own: munged wants every user to reach its socket, and none but
    root to read the key beside it."""
    return slurm_dir(state) / "munge-run" / "munge.socket.2"


def munge_key(state: LabState) -> Path:
    """The lab's munge key (made once): 1024 random bytes as base64 text, as `provisiond
    secret set` stores it; munged takes the file's bytes as they are."""
    path = slurm_dir(state) / "munge" / "munge.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        path.write_text(base64.b64encode(os.urandom(1024)).decode())
        path.chmod(0o400)
    return path


def settings(state: LabState, suspend_time: int | None, suspend_timeout: int = 30,
             resume_timeout: int = 600) -> dict:
    """provisiond.yaml's `slurm:` for the lab: slurmctld's own paths under the lab dir."""
    base = slurm_dir(state)
    return {
        "cluster_name": "pvlab", "controller": CONTROLLER,
        "controller_address": SERVER_ADDRESS, "suspend_time": suspend_time,
        "suspend_timeout": suspend_timeout, "resume_timeout": resume_timeout,
        "power_log": str(base / "log" / "power.log"),
        "options": {
            "SlurmUser": "root",  # the same uid on the nodes (Debian's slurm user's is not)
            "StateSaveLocation": str(base / "state"),
            "SlurmctldPidFile": str(base / "run" / "slurmctld.pid"),
            "SlurmctldLogFile": str(base / "log" / "slurmctld.log"),
            "SlurmctldDebug": "info",
        },
    }


def configure(state: LabState, suspend_time: int | None, **timeouts) -> None:
    """Put the lab's `slurm:` settings into provisiond.yaml (then run `slurm config`)."""
    path = state.state_dir / "provisiond.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    data["slurm"] = settings(state, suspend_time, **timeouts)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def slurm_env(state: LabState) -> dict:
    return dict(os.environ, SLURM_CONF=str(state.state_dir / "slurm" / "slurm.conf"))


def in_slurm_namespace(state: LabState, argv: list[str]) -> list[str]:
    """`argv` in a mount and UTS namespace of its own: /run a private tmpfs where the
    default munge socket path leads to the lab's munged, the host name CONTROLLER."""
    setup = (f"mount -t tmpfs -o mode=0755,size=1m pvlab-slurm /run && mkdir /run/munge && "
             f"ln -s {munge_socket(state)} {MUNGE_DEFAULT_SOCKET} && "
             f"hostname {CONTROLLER} && exec \"$@\"")
    return ["unshare", "--mount", "--uts", "--propagation", "private",
            process.tool("sh"), "-c", setup, "sh", process.tool(argv[0]), *argv[1:]]


def start(state: LabState, timeout: float = 60) -> None:
    """munged, then slurmctld (slurm.conf must exist: `provisiond slurm config`), both in
    the lab namespace, recorded in lab.json; waits until `scontrol ping` says UP."""
    base = slurm_dir(state)
    for sub in ("state", "run", "log"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    if not process.alive(state.pids.get("munged"), "munged"):
        key = munge_key(state)
        munge_socket(state).parent.mkdir(mode=0o755, exist_ok=True)
        argv = ["munged", "--foreground", f"--key-file={key}",
                f"--socket={munge_socket(state)}", f"--pid-file={munge_socket(state).parent / 'munged.pid'}",
                f"--log-file={base / 'log' / 'munged.log'}",
                f"--seed-file={base / 'munge' / 'munged.seed'}"]
        state.pids["munged"] = process.spawn(argv, base / "log" / "munged.out",
                                             netns=state.netns)
        state.save()
        _wait_started(state, "munged", munge_socket(state).exists, timeout)
    if not process.alive(state.pids.get("slurmctld"), "slurmctld"):
        argv = in_slurm_namespace(state, ["slurmctld", "-D", "-i"])
        state.pids["slurmctld"] = process.spawn(argv, base / "log" / "slurmctld.out",
                                                netns=state.netns, env=slurm_env(state))
        state.save()
    _wait_started(state, "slurmctld",
                  lambda: "is UP" in command(state, "scontrol", "ping").stdout, timeout)


def _wait_started(state: LabState, name: str, ready, timeout: float) -> None:
    """Wait until `ready()`; a daemon that died first is a LabError with its last words."""
    def check():
        if ready():
            return True
        pid = state.pids.get(name)
        if not process.alive(pid, name):
            logs = slurm_dir(state) / "log"
            words = [line for path in (logs / f"{name}.out", logs / f"{name}.log")
                     if path.exists() for line in path.read_text().splitlines()][-3:]
            raise LabError(f"{name} ({process.exit_status(pid)}) did not start: "
                           f"{' | '.join(words)}")
        return False
    process.wait_for(check, timeout, f"{name} to start")


def command(state: LabState, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A Slurm client command (sinfo, srun, sbatch, scontrol...) run where slurmctld runs;
    never raises for its exit status."""
    return process.run(in_slurm_namespace(state, list(argv)), netns=state.netns, check=False,
                       timeout=timeout, env=slurm_env(state), cwd="/tmp")


def stop(state: LabState) -> None:
    """slurmctld, then munged, by the PIDs lab.json records."""
    process.stop(state.pids.pop("slurmctld", None), "slurmctld", timeout=20)
    process.stop(state.pids.pop("munged", None), "munged")
    state.save()
