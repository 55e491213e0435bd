"""debian12 boots both ways in one run on n4: its layers unpacked into a tmpfs root, and
mounted (squashfs images loop-mounted under overlayfs, provisiond.images.squash). Prints
each boot's time to `ready` and the MemAvailable its agent reported; both must reach ready
and the mounted boot must leave more memory available."""

from __future__ import annotations

import pytest

from provisiond.inventory import InventoryStore
from tests.lab.test_boot_lab import boot_to_ready

NODE = "n4"  # bios, debian12, 3 GiB
MODES = ("unpacked", "mounted")


def set_boot_mode(lab, mode: str | None) -> None:
    """provisiond.boot=MODE as n4's only kernel arg (None: no kernel args)."""
    with InventoryStore(lab.config).edit() as inventory:
        inventory.nodes[NODE].kernel_args = [f"provisiond.boot={mode}"] if mode else None


@pytest.mark.lab
@pytest.mark.slow
def test_debian12_boots_unpacked_and_mounted_and_mounted_leaves_more_memory(lab):
    lab.build_image(lab.nodes[NODE].image)
    lab.build_overlays()
    results = {}
    try:
        for mode in MODES:
            set_boot_mode(lab, mode)
            status = boot_to_ready(lab, [NODE], timeout=900)[NODE]
            serial = open(lab.nodes[NODE].serial_log, errors="replace").read()
            results[mode] = (lab.phase_times(NODE, status), status.get("memory") or {}, serial)
    finally:
        set_boot_mode(lab, None)
    print(f"\n{'boot':10} {'ready s':>8} {'kernel->ready s':>16} {'MemTotal MiB':>13} "
          f"{'MemAvailable MiB':>17}")
    for mode, (times, memory, _) in results.items():
        print(f"{mode:10} {times['ready']:8.1f} {times['ready'] - times['kernel']:16.1f} "
              f"{memory.get('total_kib', 0) / 1024:13.0f} "
              f"{memory.get('available_kib', 0) / 1024:17.0f}")
    assert "mounted" in results["mounted"][2] and "layers read-only" in results["mounted"][2]
    assert "building the root file system in tmpfs" in results["unpacked"][2]
    available = {mode: memory["available_kib"] for mode, (_, memory, _) in results.items()}
    assert available["mounted"] > available["unpacked"], available
