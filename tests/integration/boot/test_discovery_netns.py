"""The discovery image's loop (its shipped files, run by busybox-static as the image does) in
a chroot on the client side of a veth pair, against `provisiond serve` (DHCP with a
discovery pool, HTTP) on the server side: it leases an address from the pool, reports its
facts, waits, and keeps its lease while it waits (for approval, which can take days).

The loop runs in its own mount and PID namespaces, with `reboot` and `poweroff` that only
note that they were asked: nothing it does can reach this host."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from netns import in_netns, ip, make_link
from provisiond.config import SHIPPED_DIR, load_config
from provisiond.discovery.machines import read_book
from servers import start_serve, stop_serve, write_config
from tests.conftest import run_provisiond
from tests.tools import tool

pytestmark = [pytest.mark.netns, pytest.mark.slow]
SERVER = "10.99.0.1"
POOL = "10.99.200.10-10.99.200.20"
LEASE = 60  # discovery.lease_seconds: the least it takes
MAC = "52:54:00:99:00:01"
STUB = "#!/bin/sh\necho \"${0##*/} $*\" >> /run/asked\n"


def image_files(name: str) -> dict[str, Path]:
    """Where the copy layers of a shipped image recipe put their files: dest -> source."""
    folder = SHIPPED_DIR / "images" / name
    recipe = yaml.safe_load((folder / "image.yaml").read_text())
    return {item["dest"]: (folder / item["src"]).resolve()
            for layer in recipe["layers"] if layer["kind"] == "copy" for item in layer["files"]}


def discovery_root(folder: Path, busybox: str) -> Path:
    """A root holding busybox-static's applets and the tiny and discovery images' files."""
    root = folder / "root"
    for sub in ("bin", "sbin", "usr/local/sbin", "usr/share/udhcpc", "etc", "proc", "sys",
                "dev", "run", "tmp"):
        (root / sub).mkdir(parents=True)
    (root / "bin" / "busybox").write_bytes(Path(busybox).read_bytes())
    (root / "bin" / "busybox").chmod(0o755)
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in set(applets) - {"busybox", "reboot", "poweroff", "halt"}:
        (root / "bin" / applet).symlink_to("busybox")
    for stub in ("reboot", "poweroff"):
        (root / "sbin" / stub).write_text(STUB)
        (root / "sbin" / stub).chmod(0o755)
    for dest, source in {**image_files("tiny"), **image_files("discovery")}.items():
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(0o755)
    return root


def start_discovery_loop(link, root: Path, cmdline: Path, log: Path) -> subprocess.Popen:
    """provisiond-discover in `root`, in the client's namespace, with `cmdline` as its
    /proc/cmdline; killed with its PID namespace (unshare --kill-child)."""
    mounts = (f"mount -t proc proc {root}/proc && mount --bind {cmdline} {root}/proc/cmdline"
              f" && mount -t sysfs sysfs {root}/sys && mount --bind /dev {root}/dev"
              f" && exec {tool('chroot')} {root} /usr/local/sbin/provisiond-discover")
    argv = in_netns(link.client_ns, ["unshare", "--mount", "--pid", "--fork", "--kill-child",
                                     "--propagation", "private", tool("sh"), "-c", mounts])
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_for(check, what: str, seconds: float, *procs: subprocess.Popen):
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[:3]} exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.5)


def lease_of_another_mac(link, folder: Path, suffix: str = "x") -> str:
    """The address the pool offers a second machine now: busybox udhcpc on a macvlan (a MAC
    of its own) of the client's link, in a namespace of its own (`suffix` names it). udhcpc
    quits holding the lease (no RELEASE without -R)."""
    other = f"{link.client_ns}{suffix}"
    ip("netns", "add", other)
    try:
        ip("-n", link.client_ns, "link", "add", "mv0", "link", link.client_if, "type",
           "macvlan", "mode", "bridge")
        ip("-n", link.client_ns, "link", "set", "mv0", "netns", other)
        ip("-n", other, "link", "set", "mv0", "up")
        script = folder / "print-lease"
        script.write_text('#!/bin/sh\n[ "$1" = bound ] && echo "lease $ip"\nexit 0\n')
        script.chmod(0o755)
        done = subprocess.run(in_netns(other, ["busybox", "udhcpc", "-i", "mv0", "-f", "-q",
                                               "-n", "-t", "4", "-T", "2", "-s", str(script)]),
                              capture_output=True, text=True, timeout=60)
        leases = [line.split()[1] for line in done.stdout.splitlines()
                  if line.startswith("lease ")]
        assert leases, done.stdout + done.stderr
        return leases[0]
    finally:
        subprocess.run([tool("ip"), "netns", "del", other], capture_output=True)


@pytest.fixture
def discovery_lan(tmp_path):
    """(link, state dir) with serve (DHCP with a discovery pool of 60 s leases, HTTP) on
    the server side."""
    needed = ("ip", "busybox", "unshare", "chroot", "sh")
    if os.geteuid() != 0 or not all(tool(t) for t in needed):
        pytest.skip(f"needs root (namespaces, chroot) and {', '.join(needed)}")
    link = make_link("v", f"{SERVER}/16")
    state = tmp_path / "state"
    proc = None
    try:
        assert run_provisiond(state, "init", "--address", SERVER).returncode == 0
        write_config(state, http={"port": 9873, "workers": 1},
                     dhcp={"enabled": True, "interface": link.server_if, "discovery": True},
                     discovery={"pool": POOL, "netmask": "255.255.0.0",
                                "lease_seconds": LEASE})
        proc = start_serve(state, "--no-tftp", "--no-dns", netns=link.server_ns)
        yield link, state, proc
    finally:
        if proc is not None:
            stop_serve(proc)
        link.close()


def test_a_waiting_machine_keeps_its_pool_address(discovery_lan, tmp_path):
    """The loop took its lease with `udhcpc -q`, which quits once it has one: the address
    stayed on the NIC, but its lease ran out at the server after discovery.lease_seconds,
    and the pool gave it to the next new machine (two waiting machines, one address)."""
    link, state, serve = discovery_lan
    ip("-n", link.client_ns, "link", "set", link.client_if, "address", MAC)
    root = discovery_root(tmp_path, tool("busybox"))
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(f"console=ttyS0 provisiond.url=http://{SERVER}:9873 "
                       f"provisiond.discover={MAC}\n")
    log = tmp_path / "discover.log"
    loop = start_discovery_loop(link, root, cmdline, log)
    try:
        config = load_config(state)
        machine = wait_for(lambda: read_book(config).machines.get(MAC), "report", 90,
                           loop, serve)
        enlisted = time.monotonic()
        assert machine.state.value == "pending" and machine.facts.cpu.threads > 0
        wait_for(lambda: "facts sent; waiting for approval" in log.read_text(), "wait", 30,
                 loop)
        time.sleep(max(0.0, enlisted + LEASE + 5 - time.monotonic()))
        assert loop.poll() is None, log.read_text()
        assert lease_of_another_mac(link, tmp_path) != machine.address, log.read_text()
        assert not (root / "run" / "asked").exists()  # neither rebooted nor powered off
    finally:
        loop.kill()
        loop.wait(10)


def test_a_restarted_serve_gives_a_new_machine_another_address(discovery_lan, tmp_path):
    """The pool's leases were kept in memory only: after a restart of serve, the next new
    machine was offered the address a machine had leased before it (two machines, one
    address)."""
    link, state, serve = discovery_lan
    first = lease_of_another_mac(link, tmp_path, "a")
    assert stop_serve(serve) == 0
    again = start_serve(state, "--no-tftp", "--no-dns", netns=link.server_ns,
                        log_path=tmp_path / "serve-again.log")
    try:
        assert lease_of_another_mac(link, tmp_path, "b") != first
    finally:
        stop_serve(again)
