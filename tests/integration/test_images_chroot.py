"""The build chroot's mounts (chroot.system_mounts, what image builds' run and packages steps
and image shell run in) on a small root the test makes, without Debian packages: what an
image's own /proc, /sys, /dev or /etc may make of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provisiond.errors import BuildFailed
from provisiond.images import chroot

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
