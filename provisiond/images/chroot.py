"""Working inside a layer: the overlayfs mount over the parent layers, and commands run in
a chroot with /proc, /sys and /dev mounted and services kept from starting."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from provisiond.errors import BuildFailed, Forbidden
from provisiond.images.cpio import EPOCH_ENV, source_date_epoch

CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "HOME": "/root",
              "INITRD": "No"}
POLICY_RC = "usr/sbin/policy-rc.d"
RESOLV = Path("/etc/resolv.conf")


# Capability bits (linux/capability.h) a build needs: mounts (overlayfs, /proc, /sys, /dev),
# chroot and the chroot's device nodes; the unprivileged `provisiond serve` of the systemd
# unit has none of them.
BUILD_CAPABILITIES = {21: "CAP_SYS_ADMIN (mounts)", 18: "CAP_SYS_CHROOT",
                      27: "CAP_MKNOD (the chroot's /dev)"}


def require_build_privileges(what: str = "an image build") -> None:
    """Refuse before anything is written where the process cannot mount and chroot (a
    build would fail half-way): image builds are root's work, done by the CLI."""
    missing = [name for bit, name in BUILD_CAPABILITIES.items()
               if not effective_capabilities() >> bit & 1]
    if missing:
        raise Forbidden(f"{what} needs root ({', '.join(missing)} missing in this process, "
                        f"uid {os.geteuid()}): run `provisiond image ...` as root on the head "
                        "node; `provisiond serve` runs unprivileged and builds no image")


def effective_capabilities() -> int:
    """This process's effective capability set (CapEff of /proc/self/status) as a bit mask."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def mount(*argv: str, cwd: Path | None = None) -> None:
    """Run mount(8); a failure is one line naming the mount point (argv[-1])."""
    proc = subprocess.run(["mount", *argv], capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
        raise BuildFailed(f"mount on {argv[-1]}: {first}")


def umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def overlay(lowers: list[Path], upper: Path | None, work: Path, merged: Path
            ) -> Iterator[Path]:
    """Mount lowers (top first) with `upper` as the writable layer; read-only if None.

    Dirs are named relative to the first lower's folder (mount runs there): the options
    must fit in a page, and 64-hex layer names alone let ~60 layers fit, full paths ~30."""
    merged.mkdir(parents=True, exist_ok=True)
    base = lowers[0].parent
    opts = "lowerdir=" + ":".join(os.path.relpath(p, base) for p in lowers)
    if upper is not None:
        work.mkdir(parents=True, exist_ok=True)
        # explicit, so a host whose defaults differ still writes plain upper dirs that
        # stay valid as lower dirs of other stacks
        opts += (f",upperdir={os.path.relpath(upper, base)},workdir="
                 f"{os.path.relpath(work, base)},redirect_dir=off,index=off,metacopy=off")
    if len(lowers) == 1 and upper is None:
        mount("--bind", "-o", "ro", str(lowers[0]), str(merged))
    else:
        mount("-t", "overlay", "overlay", "-o", opts, str(merged), cwd=base)
    try:
        yield merged
    finally:
        umount(merged)


# the chroot's own /dev (a tmpfs): what packages' scripts and a shell session use, and
# nothing of the host's to remove or write over (the host's /dev bound in, `rm /dev/null` in
# an image shell removed the host's). ptmx is a node, not a link to pts/ptmx: the host's
# devpts (bound on /dev/pts) has that one 0000 (systemd mounts it ptmxmode=000), so no user
# but root could open a pty; the node opens the devpts mounted at pts beside it (Linux 4.7+)
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
           "urandom": (1, 9), "tty": (5, 0), "ptmx": (5, 2)}
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}


@contextlib.contextmanager
def system_mounts(root: Path) -> Iterator[None]:
    """/proc, /sys, a /dev of its own (the host's terminals in /dev/pts) and a resolv.conf
    for apt inside root, undone after."""
    done: list[Path] = []
    dev = root / "dev"
    try:
        for target, argv in (("proc", ["-t", "proc", "proc"]), ("sys", ["-t", "sysfs", "sys"]),
                             ("dev", ["-t", "tmpfs", "-o", "mode=0755,size=16m,nosuid",
                                      "provisiond-dev"]),
                             ("dev/pts", ["--bind", "/dev/pts"]),
                             ("dev/shm", ["-t", "tmpfs", "-o", "mode=1777,nosuid,nodev",
                                          "shm"])):
            mount(*argv, str(_mount_point(root, target)))
            done.append(root / target)
            if target == "dev":
                _make_devices(dev)
        with _host_resolv_conf(root):
            yield
    finally:
        for path in reversed(done):
            umount(path)


def _mount_point(root: Path, target: str) -> Path:
    """root/target, a directory for one of the chroot's mounts. An image's symlink there is
    refused: mount(8) follows it, and an absolute one out of the image (a /dev -> /etc put
    the build's tmpfs over the host's /etc until the build ended)."""
    path = root / target
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        what = f"a symlink (to {os.readlink(path)})" if path.is_symlink() else "not a folder"
        raise BuildFailed(f"the image's /{target} is {what}: the build mounts its own "
                          "there, it must be a folder")
    path.mkdir(exist_ok=True)
    return path


def _make_devices(dev: Path) -> None:
    """The chroot's device nodes and links; one refused is one line naming it (mknod's
    error has no file name, symlink's names the target)."""
    for name in [*DEVICES, *DEV_LINKS]:
        try:
            if name in DEVICES:
                os.mknod(dev / name, 0o20666, os.makedev(*DEVICES[name]))
                os.chmod(dev / name, 0o666)  # mknod's mode passes through the umask
            else:
                os.symlink(DEV_LINKS[name], dev / name)
        except OSError as exc:
            raise BuildFailed(f"cannot make the chroot's /dev/{name}: {exc.strerror}") from None


@contextlib.contextmanager
def _host_resolv_conf(root: Path) -> Iterator[None]:
    """Let apt in the chroot resolve names with the host's resolv.conf, leaving no trace."""
    target = root / "etc/resolv.conf"
    # the image's /etc a symlink: it would lead out of the image, to a host folder
    if (target.is_symlink() or (root / "etc").is_symlink() or not (root / "etc").is_dir()
            or not RESOLV.is_file()):
        yield
        return
    created = not target.exists()
    if created:
        target.touch()
    mount("--bind", "-o", "ro", str(RESOLV), str(target))
    try:
        yield
    finally:
        umount(target)
        if created:
            target.unlink()


def chroot_env() -> dict[str, str]:
    """CHROOT_ENV with SOURCE_DATE_EPOCH, the layers' mtime clamp: tools that honour it
    write it instead of today (shadow's useradd and pwconv: the last password change in
    /etc/shadow, which made builds on two days differ)."""
    return {**CHROOT_ENV, EPOCH_ENV: str(source_date_epoch())}


def run_in_chroot(root: Path, command: str, log: Path, what: str) -> None:
    """Run one shell command in root; a failure names the command and its last output."""
    with open(log, "ab") as out:
        out.write(f"\n### {what}: {command}\n".encode())
        out.flush()
        proc = subprocess.Popen(["chroot", str(root), "/bin/sh", "-c", command],
                                stdout=out, stderr=subprocess.STDOUT, env=chroot_env(),
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if proc.returncode != 0:
        raise BuildFailed(f"{what}: command {command!r} exited {proc.returncode}: "
                          f"{_last_line(log)} (log: {log})")


def _last_line(log: Path) -> str:
    with open(log, "rb") as handle:
        handle.seek(max(0, os.path.getsize(log) - 4096))
        lines = handle.read().decode(errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else "(no output)"


def end_processes_in(root: Path, timeout: float = 10.0) -> None:
    """SIGKILL every process whose root directory is `root` or below it (what a command in
    the chroot left running, e.g. `daemon &`), and wait until they are gone, so the
    chroot's mounts come off and nothing writes on after the command's end."""
    prefix = os.path.realpath(root)  # as /proc/PID/root shows it
    deadline = time.monotonic() + timeout
    while pids := _rooted_in(prefix):
        if time.monotonic() > deadline:
            raise BuildFailed(f"processes {pids[:5]} in {root} do not end")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _rooted_in(prefix: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            where = os.readlink(f"/proc/{entry}/root")
        except OSError:  # gone, or a zombie (its mounts are released already)
            continue
        if where == prefix or where.startswith(prefix + "/"):
            found.append(int(entry))
    return found


def resolve_in_root(root: Path, path: str, follow_last: bool = False) -> Path:
    """The host path of `path` inside root, following symlinks as the chroot would (the
    last component too with `follow_last`)."""
    current = Path("/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = current.parent
            continue
        candidate = root / str(current / part).lstrip("/")
        if candidate.is_symlink() and (parts or follow_last) and hops < 40:
            hops += 1
            target = os.readlink(candidate)
            current = Path("/") if target.startswith("/") else current
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        current = current / part
    return root / str(current).lstrip("/")


def unmount_below(path: Path) -> None:
    """Unmount whatever is still mounted at or under path (deepest first), so removing a
    tree can never reach into a bind-mounted /dev or /proc."""
    prefix = str(path.resolve())
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    below = [p for p in points if p == prefix or p.startswith(prefix + "/")]
    for point in sorted(set(below), key=len, reverse=True):
        umount(Path(point))
