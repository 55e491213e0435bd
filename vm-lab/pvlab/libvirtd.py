"""libvirt without systemd: virtlogd and libvirtd inside the lab namespace, in a private
mount namespace whose /run/libvirt, /var/lib/libvirt, /etc/libvirt/qemu and /var/log/libvirt
are the lab's own directories, so the lab never meets another libvirtd on the machine.
Clients reach it through the socket in the lab dir (`LabState.libvirt_uri`)."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import time
from pathlib import Path

import libvirt

from pvlab import process
from pvlab.errors import LabError
from pvlab.layout import LabState

PRIVATE_MOUNTS = {"run": "/run/libvirt", "lib": "/var/lib/libvirt",
                  "etc-qemu": "/etc/libvirt/qemu", "log": "/var/log/libvirt"}
QEMU_USER = "libvirt-qemu"

LAUNCH = """set -e
for pair in {mounts}; do
  mkdir -p "${{pair#*=}}"; mount --bind "{base}/${{pair%%=*}}" "${{pair#*=}}"
done
"{virtlogd}" -d -p "{base}/virtlogd.pid"
"{libvirtd}" -d -p "{base}/libvirtd.pid"
"""

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def probe_accel() -> str:
    """'kvm' only where it really works: a vendor KVM module and a usable /dev/kvm.
    kvm_pvm (PVM guests only) counts as no KVM. PVLAB_ACCEL=kvm|tcg overrides."""
    forced = os.environ.get("PVLAB_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    modules = {p.name for p in Path("/sys/module").glob("kvm*")}
    if "kvm_pvm" in modules or not modules & {"kvm_intel", "kvm_amd"}:
        return "tcg"
    return "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"


def fix_kvm_device() -> None:
    """libvirt re-probes QEMU on every call (~4 s) unless its qemu user can open /dev/kvm."""
    dev = Path("/dev/kvm")
    if dev.exists() and (dev.stat().st_gid != grp.getgrnam("kvm").gr_gid
                         or dev.stat().st_mode & 0o060 != 0o060):
        os.chown(dev, -1, grp.getgrnam("kvm").gr_gid)
        dev.chmod(0o660)


def prepare_dirs(base: Path) -> None:
    """The private libvirt tree; its qemu dirs belong to the qemu user like Debian's."""
    for name in PRIVATE_MOUNTS:
        (base / name).mkdir(parents=True, exist_ok=True)
    user = pwd.getpwnam(QEMU_USER)
    for sub in ("lib/qemu", "lib/qemu/nvram", "lib/qemu/channel/target"):
        path = base / sub
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o751)


def start_libvirt(state: LabState, timeout: float = 90) -> None:
    """Start virtlogd then libvirtd (idempotent) and wait until the socket answers."""
    base = state.dir / "libvirt"
    if not process.alive(process.read_pid(base / "libvirtd.pid"), "libvirtd"):
        fix_kvm_device()
        prepare_dirs(base)
        mounts = " ".join(f"{k}={v}" for k, v in PRIVATE_MOUNTS.items())
        script = LAUNCH.format(mounts=mounts, base=base, virtlogd=process.tool("virtlogd"),
                               libvirtd=process.tool("libvirtd"))
        process.run(["unshare", "--mount", "--propagation", "private", process.tool("sh"), "-c",
                     script],
                    netns=state.netns)
    state.pids["virtlogd"] = process.read_pid(base / "virtlogd.pid") or 0
    state.pids["libvirtd"] = process.read_pid(base / "libvirtd.pid") or 0
    state.save()
    process.wait_for(lambda: _try_connect(state.libvirt_uri), timeout, "libvirtd to answer")


def connect(state: LabState) -> libvirt.virConnect:
    conn = _try_connect(state.libvirt_uri)
    if conn is None:
        raise LabError(f"cannot reach the lab's libvirtd at {state.libvirt_socket}")
    return conn


def _try_connect(uri: str) -> libvirt.virConnect | None:
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError:
        return None


def stop_libvirt(state: LabState) -> None:
    """Kill libvirtd, then virtlogd, then any qemu they left (domains are destroyed first)."""
    base = state.dir / "libvirt"
    process.stop(process.read_pid(base / "libvirtd.pid"), "libvirtd")
    process.stop(process.read_pid(base / "virtlogd.pid"), "virtlogd")
    for pid_file in (base / "run" / "qemu").glob("*.pid"):
        process.stop(process.read_pid(pid_file), "qemu-system")
    state.pids.pop("libvirtd", None)
    state.pids.pop("virtlogd", None)


def remove_dirs(state: LabState) -> None:
    """Drop the private libvirt tree (after the daemons are gone)."""
    time.sleep(0.1)
    shutil.rmtree(state.dir / "libvirt", ignore_errors=True)
