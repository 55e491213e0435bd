"""The init overlay boots for real: a Debian kernel under QEMU (TCG) with a busybox-static
image, then the node's shared and own system overlays as the initrds (as the iPXE script
orders them); the serial log must show the switch_root marker and the image's own init
running in the tmpfs root, whiteouts applied. A node whose own part is empty boots too."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from provisiond import archive
from provisiond.overlays import build_overlays, ensure_overlay
from tests.tools import command, tool

BUSYBOX = Path("/bin/busybox")
KERNEL_META = "linux-image-amd64"

TEST_INIT = """#!/bin/sh
echo "TEST-INIT: running as pid $$ in $(cat /proc/mounts | grep ' / ' | cut -d' ' -f3) root"
echo "TEST-INIT: hostname file says $(cat /etc/hostname)"
if [ -e /etc/delete-me ]; then echo "TEST-INIT: whiteout NOT applied"; else
  echo "TEST-INIT: whiteout applied"; fi
grep -q "n002.lab" /etc/hosts && echo "TEST-INIT: hosts lists n002"
grep -q "provisiond-agent boot" /etc/init.d/S90agent && echo "TEST-INIT: rcS hook runs the agent"
/usr/local/sbin/provisiond-agent boot; echo "TEST-INIT: agent exit $?"
/usr/local/sbin/provisiond-network; echo "TEST-INIT: network exit $?"
echo "TEST-INIT: done"
reboot -f
"""


def cache_dir() -> Path:
    """Downloads shared with the image builder when PROVISIOND_CACHE_DIR is set."""
    shared = os.environ.get("PROVISIOND_CACHE_DIR")
    return Path(shared) if shared else Path.home() / ".cache" / "provisiond"


def _kernel_package() -> str:
    out = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True,
                         text=True).stdout
    found = re.findall(r"Depends: (linux-image-\d\S+)", out)
    if not found:
        pytest.skip(f"apt knows no {KERNEL_META} (run apt-get update)")
    return found[0]


def debian_kernel() -> Path:
    """A Debian vmlinuz, downloaded once with apt-get download into the cache."""
    kernels = cache_dir() / "kernels"
    found = sorted(kernels.glob("vmlinuz-*"))
    if found:
        return found[-1]
    debs = cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    package = _kernel_package()
    if not list(debs.glob(f"{package}_*.deb")):
        subprocess.run(["apt-get", "download", package], cwd=debs, check=True,
                       capture_output=True, timeout=600)
    deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
    kernels.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -x -C {kernels} "
                         "--wildcards './boot/vmlinuz-*'", shell=True, capture_output=True)
    assert tar.returncode == 0, tar.stderr
    for vmlinuz in (kernels / "boot").glob("vmlinuz-*"):
        vmlinuz.rename(kernels / vmlinuz.name)
    return sorted(kernels.glob("vmlinuz-*"))[-1]


def busybox_image() -> bytes:
    """A minimal image layer: busybox-static with its applets, a test init, a whiteout."""
    applets = subprocess.run([str(BUSYBOX), "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    entries = [archive.dir_entry("bin"), archive.dir_entry("sbin"),  # not implied (merged /usr)
               archive.file_entry("bin/busybox", BUSYBOX.read_bytes(), 0o755),
               archive.file_entry("sbin/init", TEST_INIT.encode(), 0o755),
               archive.file_entry("sbin/test-init", TEST_INIT.encode(), 0o755),
               archive.file_entry("etc/delete-me", b"the image's whiteout list removes me\n"),
               archive.file_entry(".provisiond/whiteouts", b"/etc/delete-me\n")]
    entries += [archive.symlink_entry(path, "/bin/busybox") for path in applets
                if path not in ("bin/busybox", "sbin/init")]
    return archive.compress(archive.pack(archive.with_parents(entries)), "zstd")


def _write_inventory(state_dir: Path, compression: str) -> None:
    nodes = {f"n00{i}": {"netdevs": {"eth0": {"mac": f"52:54:00:00:00:0{i}",
                                              "ipaddr": f"10.99.77.1{i}",
                                              "netmask": "255.255.255.0"}},
                         "system_overlays": ["init", "hostname", "hosts", "network", "agent"],
                         "runtime_overlays": ["ssh"]} for i in (1, 2)}
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump({"nodes": nodes}))
    config_path = state_dir / "provisiond.yaml"
    text = config_path.read_text().replace("domain: cluster", "domain: lab")
    config_path.write_text(text.replace("compression: zstd", f"compression: {compression}"))


def boot(kernel: Path, initrd: Path, append: str, timeout: float = 240) -> str:
    argv = command(["qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-nographic",
                    "-no-reboot", "-nic", "none", "-kernel", str(kernel), "-initrd", str(initrd),
                    "-append", f"console=ttyS0 panic=-1 {append}"])
    log = initrd.with_name("serial.log")
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.skipif(not tool("qemu-system-x86_64") or not BUSYBOX.exists(),
                    reason="needs qemu-system-x86 and busybox-static")
@pytest.mark.parametrize("compression, append, init", [
    ("zstd", "quiet", "/sbin/init"),
    ("gzip", "quiet provisiond.init=/sbin/test-init", "/sbin/test-init"),
])
def test_init_overlay_switches_root_into_the_image_init(tmp_path, config, compression,
                                                        append, init):
    _write_inventory(config.state_dir, compression)
    from provisiond.config import load_config

    config = load_config(config.state_dir)
    build_overlays(config, kinds=("system",))
    shared, own = (ensure_overlay(config, "n001", k).read_bytes() for k in ("shared", "system"))
    initrd = tmp_path / "initrd"
    initrd.write_bytes(busybox_image() + shared + own)  # what iPXE hands the kernel
    log = boot(debian_kernel(), initrd, append)
    assert f"provisiond-init: switching root to {init}" in log, log[-3000:]
    assert "TEST-INIT: running as pid 1 in tmpfs root" in log, log[-3000:]
    assert "TEST-INIT: hostname file says n001" in log
    assert "TEST-INIT: whiteout applied" in log
    assert "TEST-INIT: hosts lists n002" in log
    assert "TEST-INIT: rcS hook runs the agent" in log
    assert "TEST-INIT: agent exit 0" in log  # no provisiond.url: nothing to do, exits 0
    assert "provisiond-network: no interface has MAC 52:54:00:00:00:01" in log
    assert "TEST-INIT: done" in log


@pytest.mark.slow
@pytest.mark.skipif(not tool("qemu-system-x86_64") or not BUSYBOX.exists(),
                    reason="needs qemu-system-x86 and busybox-static")
def test_empty_node_part_is_accepted_by_the_kernel(tmp_path, config):
    """A node with only node-independent overlays gets a trailer-only node part."""
    _write_inventory(config.state_dir, "zstd")
    data = yaml.safe_load((config.state_dir / "inventory.yaml").read_text())
    data["nodes"]["n001"]["system_overlays"] = ["init", "hosts"]
    (config.state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    from provisiond.config import load_config

    config = load_config(config.state_dir)
    shared, own = (ensure_overlay(config, "n001", k).read_bytes() for k in ("shared", "system"))
    assert archive.unpack(archive.decompress(own)) == []
    initrd = tmp_path / "initrd"
    initrd.write_bytes(busybox_image() + shared + own)
    log = boot(debian_kernel(), initrd, "quiet")
    assert "provisiond-init: switching root to /sbin/init" in log, log[-3000:]
    assert "TEST-INIT: hosts lists n002" in log and "TEST-INIT: done" in log
