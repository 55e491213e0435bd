"""debian12 boots both ways in one run on n4: its layers unpacked into a tmpfs root, and
mounted (squashfs images loop-mounted under overlayfs, provisiond.images.squash). Prints
each boot's time to `ready`, where that time went (host times at which the serial console
showed each step) and where the memory went (the node's /proc/meminfo over ssh); both must
reach ready and the mounted boot must leave more memory available. Then n4 gets less RAM
than the unpacked image needs: the unpacked boot fails with the reason on its console, the
mounted one reaches ready. Root logs in over ssh with the lab's key."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from provisiond.images import blob_path, load_manifest
from provisiond.inventory import InventoryStore
from tests.lab.test_boot_lab import boot_to_ready

NODE = "n4"  # bios, debian12, 3 GiB
MODES = ("unpacked", "mounted")
SMALL_MIB = 512  # the domain memory of the too-little-RAM boots
# serial console steps, in boot order: (name, pattern of the line that ends the step)
STEPS = [
    ("firmware+dhcp", r"provisiond: booting "),
    ("download", r"/overlays/\S+/system\.\.\. ok"),
    ("to kernel", r"\] Linux version "),  # iPXE places the initrds, the kernel unpacks itself
    ("kernel start", r"Trying to unpack rootfs"),
    ("initramfs unpack", r"Freeing initrd memory"),
    ("to /init", r"Run /\S+ as init process"),
    ("/init", r"provisiond-init: switching root"),
    ("systemd start", r"Welcome to "),
]
MEMINFO = ("MemTotal", "MemAvailable", "MemFree", "Cached", "Shmem", "AnonPages",
           "Active(file)", "Inactive(file)", "SReclaimable", "SUnreclaim", "KernelStack",
           "PageTables", "VmallocUsed", "Percpu", "Unevictable")
PROBE = ("cat /proc/meminfo; echo '#df'; df -k -x devtmpfs | tail -n +2; echo '#loop'; "
         "for f in /sys/block/loop*/loop/backing_file; do [ -f $f ] && "
         "echo $f $(cat ${f%/loop/backing_file}/size); done; true")
FAILED_UNPACKED = (r"provisiond-init: ERROR: .*", r"Initramfs unpacking failed: .*",
                   r"Kernel panic - .*", r"Out of memory: .*")


class SerialClock:
    """The host time at which each line first shows on a serial console log (polled every
    0.2 s while the boot runs): the boot's steps, timed from outside the guest."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.lines: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> SerialClock:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _follow(self) -> None:
        done, partial, inode = 0, b"", None
        while not self._stop.wait(0.2):
            try:
                with open(self.path, "rb") as log:
                    info = os.fstat(log.fileno())
                    if info.st_ino != inode or info.st_size < done:  # a new boot's new log
                        done, partial, inode = 0, b"", info.st_ino  # (inodes are reused)
                        self.lines = []
                    log.seek(done)
                    data = log.read()
            except FileNotFoundError:
                continue
            done += len(data)
            *complete, partial = (partial + data).replace(b"\r", b"").split(b"\n")
            now = time.time()
            self.lines += [(now, line.decode(errors="replace")) for line in complete]

    def first(self, pattern: str) -> tuple[float, str] | None:
        found = [(at, line) for at, line in self.lines if re.search(pattern, line)]
        return found[0] if found else None

    def steps(self, started: float, ready: float) -> dict[str, float]:
        """Seconds each step of STEPS took (those whose end the console showed), then the
        rest to `ready` (systemd and the agent)."""
        took, last = {}, started
        for name, pattern in STEPS:
            hit = self.first(pattern)
            if hit:
                took[name], last = round(hit[0] - last, 1), hit[0]
        took["to ready"] = round(started + ready - last, 1)
        return took


def set_boot_mode(lab, mode: str | None) -> None:
    """provisiond.boot=MODE as n4's only kernel arg (None: no kernel args)."""
    with InventoryStore(lab.config).edit() as inventory:
        inventory.nodes[NODE].kernel_args = [f"provisiond.boot={mode}"] if mode else None


def probe_memory(lab, seconds: float = 180) -> dict:
    """/proc/meminfo (KiB), the file systems (KiB used) and loop devices of the booted node
    (ssh retried while sshd does not answer yet)."""
    deadline = time.monotonic() + seconds
    while (result := lab.ssh(NODE, PROBE, timeout=60)).returncode == 255 and (
            time.monotonic() < deadline):
        time.sleep(3)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    meminfo, _, rest = out.partition("#df")
    found = {key: int(value.split()[0]) for key, value in
             (line.split(":", 1) for line in meminfo.splitlines() if ":" in line)}
    df, _, loops = rest.partition("#loop")
    found["df"] = {parts[5]: int(parts[2]) for parts in map(str.split, df.splitlines())
                   if len(parts) >= 6}
    found["loops"] = [line.split()[-1] for line in loops.splitlines() if line.strip()]
    return found


def boot_measured(lab, mode: str) -> dict:
    """One boot of n4 in `mode` to ready: phases, console steps, memory."""
    set_boot_mode(lab, mode)
    with SerialClock(lab.nodes[NODE].serial_log) as clock:
        status = boot_to_ready(lab, [NODE], timeout=900)[NODE]
        probe = probe_memory(lab)
        time.sleep(0.5)
    times = lab.phase_times(NODE, status)
    return {"times": times, "memory": status.get("memory") or {},
            "steps": clock.steps(lab.nodes[NODE].started, times["ready"]), "probe": probe,
            "serial": "\n".join(line for _, line in clock.lines)}


def print_figures(results: dict[str, dict]) -> None:
    print(f"\n{'boot':10} {'ready s':>8} {'kernel->ready s':>16} {'MemTotal MiB':>13} "
          f"{'MemAvailable MiB':>17} {'in use MiB':>11}")
    for mode, result in results.items():
        times, memory = result["times"], result["memory"]
        total, available = memory.get("total_kib", 0) / 1024, memory.get("available_kib",
                                                                          0) / 1024
        print(f"{mode:10} {times['ready']:8.1f} {times['ready'] - times['kernel']:16.1f} "
              f"{total:13.0f} {available:17.0f} {total - available:11.0f}")
    names = [name for name, _ in STEPS] + ["to ready"]
    print("\nconsole steps (s, host clock):", " | ".join(names))
    for mode, result in results.items():
        print(f"{mode:10}", " | ".join(str(result["steps"].get(name, "-")) for name in names))
    print("\n/proc/meminfo after ready (MiB):", " ".join(MEMINFO))
    for mode, result in results.items():
        probe = result["probe"]
        print(f"{mode:10}", " ".join(f"{probe.get(key, 0) / 1024:.0f}" for key in MEMINFO),
              "| used KiB:", probe["df"], "| loop sectors:", probe["loops"])


@pytest.mark.lab
@pytest.mark.slow
def test_debian12_boots_unpacked_and_mounted_and_mounted_leaves_more_memory(
        lab, debian12_layers):
    lab.build_image(lab.nodes[NODE].image)  # must build in CI: a failure here fails the test
    lab.build_overlays()
    try:
        results = {mode: boot_measured(lab, mode) for mode in MODES}
        # root logs in with the lab's key (authorized by the ssh overlay), the node showing
        # the host key the ssh overlay gave it (lab.ssh checks it)
        login = lab.ssh(NODE, "hostname && systemctl is-active ssh")
    finally:
        set_boot_mode(lab, None)
    print_figures(results)
    assert login.stdout.split() == [NODE, "active"], login
    for result in results.values():
        assert "provisiond-init: switching root to" in result["serial"]
    assert "mounted" in results["mounted"]["serial"]
    assert "layers read-only" in results["mounted"]["serial"]
    assert "building the root file system in tmpfs" in results["unpacked"]["serial"]
    available = {mode: r["memory"]["available_kib"] for mode, r in results.items()}
    assert available["mounted"] > available["unpacked"], available


def expanded_bytes(lab, image: str) -> int:
    """What the unpacked boot writes into RAM for the image's layers: their cpio streams
    decompressed (each is unpacked into the initramfs, then /init copies it to a tmpfs)."""
    total = 0
    for layer in load_manifest(lab.config, image)["layers"]:
        with open(blob_path(lab.config, layer["digest"]), "rb") as blob:
            unpack = subprocess.run(["zstd", "-dc"] if layer.get("compression") == "zstd"
                                    else ["gzip", "-dc"], stdin=blob, capture_output=True,
                                    check=True)
        total += len(unpack.stdout)
    return total


def set_memory(lab, mib: int) -> None:
    """Redefine n4's (inactive or next-started) domain with `mib` of RAM."""
    from pvlab import domains, libvirtd

    node = lab.nodes[NODE]
    node.memory_mib = mib
    xml = domains.domain_xml(node, lab.state.accel, lab.dir)
    xml = xml.replace("<name>", f"<uuid>{node.uuid}</uuid>\n  <name>", 1)  # the same domain
    libvirtd.connect(lab.state).defineXML(xml)


def wait_console(lab, patterns: tuple[str, ...], timeout: float) -> str | None:
    """The first console line matching one of `patterns` before `timeout`, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = Path(lab.nodes[NODE].serial_log).read_bytes().decode(errors="replace")
        for pattern in patterns:
            found = re.search(pattern, text.replace("\r", ""))
            if found:
                return found.group(0)
        time.sleep(1)
    return None


@pytest.mark.lab
@pytest.mark.slow
def test_a_node_with_too_little_ram_for_the_unpacked_image_boots_mounted(
        lab, debian12_layers):
    image = lab.nodes[NODE].image
    lab.build_image(image)
    lab.build_overlays()
    needed = 2 * expanded_bytes(lab, image)  # initramfs + its tmpfs copy before switch_root
    mounted = load_manifest(lab.config, image)["mounted"]
    squashed = sum(layer["size"] for layer in mounted["layers"]) + mounted["kit"]["size"]
    print(f"\n{image}: unpacked needs {needed / 2**20:.0f} MiB of RAM (2 x "
          f"{needed / 2**21:.0f} MiB expanded), mounted layers {squashed / 2**20:.0f} MiB; "
          f"VM memory {SMALL_MIB} MiB")
    assert needed > SMALL_MIB * 2**20
    before = lab.nodes[NODE].memory_mib
    set_memory(lab, SMALL_MIB)
    try:
        set_boot_mode(lab, "unpacked")
        lab.boot([NODE])
        reason = wait_console(lab, FAILED_UNPACKED, timeout=900)
        print(f"unpacked in {SMALL_MIB} MiB: {reason}")
        assert reason, lab.serial_tail(NODE, 30)
        assert lab.wait_ready([NODE], timeout=1)[NODE].get("phase") != "ready"
        result = boot_measured(lab, "mounted")
        print_figures({"mounted": result})
        assert result["memory"]["total_kib"] < needed / 1024
    finally:
        set_boot_mode(lab, None)
        set_memory(lab, before)
