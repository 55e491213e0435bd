"""The shipped facts collector (POSIX sh) run by busybox sh and by the system's sh on a fake
/sys and /proc: its output is what the server's Facts model accepts, and says what the tree
says (sockets, cores and threads from the CPU topology, memory from the online blocks)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provisiond.config import SHIPPED_DIR
from provisiond.discovery.facts import Facts

COLLECTOR = SHIPPED_DIR / "overlays" / "agent" / "usr" / "local" / "sbin" / "provisiond-facts"
SHELLS = [s for s in (["/bin/busybox", "sh"], ["/bin/sh"]) if os.path.exists(s[0])]


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


@pytest.fixture
def tree(tmp_path) -> Path:
    """Two sockets of two cores of two threads; 3 GiB in 24 online blocks of 128 MiB plus
    one offline; a disk, a loop device, a NIC and a virtual one; DMI with a quote."""
    root = tmp_path / "root"
    for cpu in range(8):
        base = f"/sys/devices/system/cpu/cpu{cpu}"
        write(root, f"{base}/topology/physical_package_id", f"{cpu // 4}\n")
        write(root, f"{base}/topology/core_id", f"{(cpu // 2) % 2}\n")
        write(root, f"{base}/online", "1\n")
    write(root, "/proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU @ 2.0GHz\n")
    write(root, "/sys/devices/system/memory/block_size_bytes", "8000000\n")
    for block in range(25):
        write(root, f"/sys/devices/system/memory/memory{block}/state",
              "online\n" if block < 24 else "offline\n")
    write(root, "/sys/block/sda/size", "1953525168\n")
    write(root, "/sys/block/sda/device/model", "SAMSUNG MZ7\n")
    write(root, "/sys/block/sda/device/serial", "S1234\n")
    write(root, "/sys/block/loop0/size", "0\n")
    for name, mac, device in (("eno1", "b0:26:28:00:00:01", True),
                              ("docker0", "02:42:00:00:00:01", False)):
        write(root, f"/sys/class/net/{name}/address", f"{mac}\n")
        write(root, f"/sys/class/net/{name}/carrier", "1\n")
        write(root, f"/sys/class/net/{name}/speed", "25000\n")
        if device:
            (root / f"sys/class/net/{name}/device").mkdir()
    write(root, "/sys/class/dmi/id/sys_vendor", "Dell Inc.\n")
    write(root, "/sys/class/dmi/id/product_name", 'PowerEdge "R650"\\x\n')
    write(root, "/sys/class/dmi/id/product_serial", "ABC123\n")
    write(root, "/sys/class/dmi/id/product_uuid", "4c4c4544-0000-1000-8000-000000000001\n")
    return root


def collect(shell: list[str], root: Path) -> Facts:
    env = {"PATH": "/usr/bin:/bin", "PROVISIOND_FACTS_ROOT": str(root)}
    out = subprocess.run([*shell, str(COLLECTOR)], env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return Facts.model_validate_json(out, strict=True)


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_collector_reports_what_the_tree_says(shell, tree):
    facts = collect(shell, tree)
    assert (facts.cpu.sockets, facts.cpu.cores, facts.cpu.threads) == (2, 4, 8)
    assert facts.cpu.model == "Test CPU @ 2.0GHz"
    assert facts.memory_mib == 3072
    assert [(d.name, d.size_bytes, d.model, d.serial) for d in facts.disks] == [
        ("sda", 1953525168 * 512, "SAMSUNG MZ7", "S1234")]
    assert [(n.name, n.mac, n.link, n.speed_mbps) for n in facts.nics] == [
        ("eno1", "b0:26:28:00:00:01", True, 25000)]
    assert (facts.dmi.vendor, facts.dmi.product, facts.dmi.serial) == (
        "Dell Inc.", 'PowerEdge "R650"\\x', "ABC123")
    assert facts.bmc is None


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_without_topology_or_memory_blocks_it_falls_back_to_proc(shell, tree):
    shutil.rmtree(tree / "sys/devices")
    (tree / "proc/cpuinfo").write_text("processor\t: 0\nprocessor\t: 1\n")
    (tree / "proc/meminfo").write_text("MemTotal:        2000000 kB\n")
    facts = collect(shell, tree)
    assert (facts.cpu.sockets, facts.cpu.cores, facts.cpu.threads) == (1, 2, 2)
    assert facts.memory_mib == 1953 and facts.cpu.model is None


def test_the_discovery_image_copies_the_agents_collector(config):
    from provisiond.images.recipe import load_recipe

    copy = [step for step in load_recipe(config, "discovery").steps if step.kind == "copy"][-1]
    sources = [(copy.folder / item.src).resolve() for item in copy.layer.files]
    assert COLLECTOR.resolve() in sources and all(s.is_file() for s in sources)


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_hardware_beyond_the_servers_bounds_still_gives_a_report_it_takes(shell, tree):
    """An InfiniBand port (a 20-byte address), a NIC without an address, a storage node's 70
    disks (or a disk name with a '!'), DMI strings with bytes that are not UTF-8 text or a character cut at the 128th
    byte: each made the whole report a 400, so such a machine could never enlist nor a node
    report its facts."""
    for name, address, kind in (("ib0", ":".join(["80"] * 20), "32"), ("can0", "", "280")):
        write(tree, f"/sys/class/net/{name}/address", f"{address}\n")
        write(tree, f"/sys/class/net/{name}/type", f"{kind}\n")
        (tree / f"sys/class/net/{name}/device").mkdir()
    write(tree, "/sys/class/net/eno1/type", "1\n")
    write(tree, "/sys/block/cciss!c0d0/size", "1000\n")  # an old HP Smart Array's name
    for i in range(70):
        write(tree, f"/sys/block/sd{i:03d}/size", "1000\n")
    (tree / "sys/class/dmi/id/product_serial").write_bytes(b"\xff\xfe\x7fSN\x85 9\n")
    (tree / "sys/class/dmi/id/product_name").write_bytes(("x" * 127 + "é\n").encode())
    facts = collect(shell, tree)
    assert [n.name for n in facts.nics] == ["eno1"]
    assert len(facts.disks) == 64 and "cciss!c0d0" not in [d.name for d in facts.disks]
    assert facts.dmi.serial == "SN 9" and facts.dmi.product == "x" * 127
