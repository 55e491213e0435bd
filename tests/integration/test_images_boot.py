"""The tiny image really boots: its kernel blob and layer blobs, handed to QEMU (TCG) as
kernel + concatenated initrds, reach busybox init and the rcS marker. No network."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path

import pytest

from provisiond.config import load_config, write_default_config
from provisiond.images import blob_path, build_image
from tests.tools import command, tool

pytestmark = [pytest.mark.lab, pytest.mark.skipif(
    not tool("qemu-system-x86_64"), reason="qemu-system-x86 is not installed")]
MARKER = b"tiny: rcS done"


def read_until(proc: subprocess.Popen, marker: bytes, seconds: float) -> bytes:
    seen = b""
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while marker not in seen and time.monotonic() < deadline and proc.poll() is None:
        if selector.select(timeout=1):
            seen += os.read(proc.stdout.fileno(), 65536)
    return seen


def test_tiny_boots_to_init_under_tcg(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISIOND_CACHE_DIR",
                       os.environ.get("PROVISIOND_CACHE_DIR", "/var/tmp/provisiond-test-cache"))
    write_default_config(tmp_path / "state")
    config = load_config(tmp_path / "state")
    manifest = build_image(config, "tiny")
    boot_to_marker(config, manifest, tmp_path, 120)


def boot_to_marker(config, manifest: dict, tmp_path: Path, seconds: float) -> None:
    """QEMU (TCG, no network) boots `manifest`'s kernel with its cpio layers as the initrd
    until tiny's rcS marker; a failure shows the console's end."""
    initrd = tmp_path / "initrd"
    initrd.write_bytes(b"".join(blob_path(config, l["digest"]).read_bytes()
                                for l in manifest["layers"]))
    args = " ".join([*manifest["kernel_args"], f"rdinit={manifest['init']}", "panic=-1"])
    proc = subprocess.Popen(
        command(["qemu-system-x86_64", "-accel", "tcg", "-m", "384", "-nographic",
                 "-no-reboot", "-nic", "none",
                 "-kernel", str(blob_path(config, manifest["kernel"]["digest"])),
                 "-initrd", str(initrd), "-append", args]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        output = read_until(proc, MARKER, seconds)
    finally:
        proc.kill()
        proc.wait()
    assert MARKER in output, output[-2000:].decode(errors="replace")
    assert b"Kernel panic" not in output
