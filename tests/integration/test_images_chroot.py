"""The build chroot's mounts (chroot.system_mounts, what image builds' run and packages steps
and image shell run in) on a small root the test makes, without Debian packages: what an
image's own /proc, /sys, /dev or /etc may make of them."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from provisiond.errors import BuildFailed
from provisiond.images import chroot
from tests.tools import tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the chroot's mounts need root")


def mounts_below(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    return [p for p in points if p.startswith(f"{path}/")]


def image_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    return root


@pytest.mark.parametrize("target", ["proc", "sys", "dev"])
def test_an_image_symlink_where_a_mount_goes_is_refused_not_followed(tmp_path, target):
    """mount(8) follows a symlink at its mount point: an image (a registry's, a recipe's tar
    layer) whose /dev was a symlink to a host folder had the build's tmpfs mounted over that
    folder for the build (an absolute link resolves on the host: /dev -> /etc hid the host's
    /etc), /proc and /sys the same with procfs and sysfs. Refused in one line, nothing
    mounted, the folder as it was."""
    root = image_root(tmp_path)
    host_folder = tmp_path / "host-folder"
    host_folder.mkdir()
    (host_folder / "precious").write_text("the host's\n")
    (root / target).symlink_to(host_folder)
    with pytest.raises(BuildFailed) as refused:
        with chroot.system_mounts(root):
            pytest.fail(f"the chroot was set up over a symlinked /{target}")
    assert str(refused.value) == (f"the image's /{target} is a symlink (to {host_folder}): "
                                  "the build mounts its own there, it must be a folder")
    assert sorted(os.listdir(host_folder)) == ["precious"]
    assert mounts_below(tmp_path) == []


@pytest.mark.skipif(not chroot.RESOLV.is_file(), reason="the host has no resolv.conf file")
def test_an_image_whose_etc_is_a_symlink_gets_no_resolv_conf_in_a_host_folder(tmp_path):
    """The host's resolv.conf is bound on the image's (made empty first if missing): through
    an image's /etc -> HOST-FOLDER it was made and bound in that host folder."""
    root = tmp_path / "root"
    root.mkdir()
    host_folder = tmp_path / "host-folder"
    host_folder.mkdir()
    (root / "etc").symlink_to(host_folder)
    with chroot.system_mounts(root):
        assert os.listdir(host_folder) == []
        assert not [p for p in mounts_below(tmp_path) if p.startswith(str(host_folder))]
    assert mounts_below(tmp_path) == []


def test_a_user_in_the_chroot_can_open_a_pty(tmp_path):
    """/dev/ptmx was a link to pts/ptmx, the host's devpts's own (bound on /dev/pts): 0000
    where systemd mounts devpts (ptmxmode=000), so in a session or a package's script only
    root got a pty (`su` to a user, then script, tmux, expect failed); the host's /dev/ptmx,
    bound in before the chroot had a /dev of its own, is 0666. Now a node like it, whose
    ptys are the host's devpts's, as the session's terminal is."""
    busybox = tool("busybox")
    if busybox is None:
        pytest.skip("busybox-static is not installed")
    root = image_root(tmp_path)
    (root / "bin").mkdir()
    shutil.copy(busybox, root / "bin/busybox")
    (root / "bin/sh").symlink_to("busybox")
    with chroot.system_mounts(root):
        ptmx = os.stat(root / "dev/ptmx", follow_symlinks=False)
        assert stat.S_ISCHR(ptmx.st_mode) and os.major(ptmx.st_rdev) == 5
        assert stat.S_IMODE(ptmx.st_mode) == 0o666
        opened = subprocess.run(
            [tool("chroot"), "--userspec=65534:65534", str(root), "/bin/sh", "-c",
             "exec 3<>/dev/ptmx && ls /dev/pts"], capture_output=True, text=True, timeout=30)
        if opened.returncode == 127:
            pytest.skip("busybox here is not a static binary")
    assert opened.returncode == 0, opened.stderr
    assert "ptmx" in opened.stdout.split()


MKNOD_REFUSED = """
import sys
from pathlib import Path
from provisiond.errors import BuildFailed
from provisiond.images import chroot
try:
    with chroot.system_mounts(Path(sys.argv[1])):
        print("made")
except BuildFailed as exc:
    print(exc)
"""


def test_a_device_node_the_kernel_refuses_is_named_in_its_one_line(tmp_path):
    """In a user namespace the process has CAP_MKNOD (the check before a build passes) but
    the kernel makes no device node, as under a device policy. mknod's error carries no file
    name: the line said `cannot make the chroot's None: Operation not permitted`."""
    if tool("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    root = image_root(tmp_path)
    tmp_path.chmod(0o755)
    done = subprocess.run([tool("unshare"), "--user", "--map-root-user", "--mount", "--net",
                           "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                           MKNOD_REFUSED, str(root)], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0 or done.stdout.strip() == "made":
        pytest.skip(f"no user namespace here, or it makes device nodes: {done.stderr.strip()}")
    assert done.stdout.splitlines() == [
        "cannot make the chroot's /dev/null: Operation not permitted"]
