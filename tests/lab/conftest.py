"""The VM lab for tests marked `lab`: real libvirt domains PXE-booting from `provisiond serve`.

The session fixture `lab` brings one lab up for all lab tests and always tears it down at
the end, failing the session if anything of it is still alive. What it offers
(a `pvlab.lab.Lab`, see vm-lab/pvlab/lab.py):

- lab.config       provisiond Config of the lab's state dir (inventory, secrets, status)
- lab.netns        the lab's network namespace (br0 10.99.77.1/24; provisiond serve runs there)
- lab.nodes        name -> LabNode: .domain (libvirt name), .uuid, .mac, .ipaddr,
                   .firmware ('bios'|'uefi'), .image, .serial_log (path), .ipmi_port
                   n1 bios, n2 bios, n3 uefi (image tiny); n4 bios (image debian12);
                   n6, n7, n8 bios (image debian12-compute, built by the `compute_image`
                   fixture, once per session, for the tests that boot them; the
                   `debian12_layers` fixture gives the lab the session's debian12 layers,
                   so that neither image's build runs debootstrap again)
- lab.boot(names) / lab.wait_ready(names, timeout) -> {name: status dict}
- lab.phase_times(name, status), lab.serial_tail(name, lines)
- lab.redfish      (host, port) of sushy-tools (libvirt driver, no auth; system id = UUID)
- lab.ipmi         name -> (host, port) of its virtualbmc endpoint (admin/password; needs
                   IPMI cipher suite 3)
- lab.serve        {'pid', 'log', 'url'} of the running `provisiond serve` (pid None if it
                   stopped); lab.serve_pid the same pid
- lab.tcp_open(host, port)   TCP connect from inside the namespace
- lab.state.libvirt_uri      libvirt URI of the lab's private libvirtd

Inventory: odd nodes (n1, n3) have bmc.driver redfish (127.0.0.1, lab.redfish port, scheme
http, system_id = UUID), even nodes (n2, n4) ipmi (127.0.0.1, their lab.ipmi port, cipher
suite 3); every node's bmc_password secret is "password". Tests that change a node's BMC
settings or power state should leave the node powered off or booted as they found it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "vm-lab"))

LAB_PLAN = ("n1:bios,n2:bios,n3:uefi,n4:bios:debian12,n5:bios,"
            "n6:bios:debian12-compute,n7:bios:debian12-compute,n8:bios:debian12-compute")


def _missing() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the VM lab needs root"
    from pvlab.process import find_tool

    for tool in ("libvirtd", "virtlogd", "qemu-system-x86_64", "sushy-emulator", "vbmcd"):
        if not find_tool(tool):
            return f"{tool} is not installed (vm-lab/install-deps.sh)"
    return None


def _down_stale_labs(lab_class) -> None:
    """Tear down labs of earlier sessions that died before their finaliser ran."""
    for lab_json in Path("/var/tmp").glob("pvlab-test-*/lab.json"):
        owner = lab_json.parent.name.rsplit("-", 1)[1]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            lab_class(lab_json.parent).down()


@pytest.fixture(scope="session")
def lab():
    """One lab for the session: up, tiny image built, serve running; always torn down."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from pvlab.lab import Lab

    _down_stale_labs(Lab)
    lab = Lab(Path(f"/var/tmp/pvlab-test-{os.getpid()}"), LAB_PLAN)
    try:
        lab.up(serve=False)
        lab.build_image("tiny")
        lab.build_overlays()
        lab.start_serve()
        yield lab
    finally:
        left = lab.down()
        shutil.rmtree(lab.state.state_dir, ignore_errors=True)  # logs and consoles stay
    assert not left, f"the lab left these behind: {', '.join(left)}"


@pytest.fixture(scope="session")
def debian12_layers(lab, debian12_built) -> int:
    """The session's debian12 build (tests/conftest.py; debian12-compute too once
    tests/integration/test_images_debian.py has built it there) copied into the lab's
    layer cache, so that the lab's `image build` of debian12 and debian12-compute reuses
    those layers rather than run debootstrap and apt again; how many layers it has."""
    from tests.shared_images import seed_layer_cache

    return seed_layer_cache(debian12_built[0], lab.config.state_dir)


@pytest.fixture(scope="session")
def compute_image(lab, debian12_layers) -> str:
    """debian12-compute built once per session (its debian12 layers are shared with n4's
    image) and every node's overlays rebuilt against it; its name."""
    lab.build_image("debian12-compute")
    lab.build_overlays()
    return "debian12-compute"
