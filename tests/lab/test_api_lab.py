"""Issue 12 in the VM lab: one VM booted to `ready` through the HTTP API only.

examples/inventory_sync.py, run in the lab namespace against the lab's `provisiond serve`,
registers n5 from a CSV (its MAC, address and Redfish BMC on the lab's sushy-tools), sets its
BMC password, builds its overlays as an API job, powers it on as an API job and follows
`GET /api/v1/events` until n5 reports `ready`. No provisiond CLI call but the documented
bootstrap, `provisiond token create`; n5's earlier lab record is removed through the API too.

The lab's own BMC emulators listen on the host's loopback, where the test process drives them;
`provisiond serve`, and so the runner of its power jobs, lives in the lab namespace, whose
loopback is another. The fixture `redfish_in_netns` runs sushy-emulator with the lab's
settings (same libvirtd, so the same domains) on the namespace's loopback for the serve.
"""

from __future__ import annotations

import sys
import time

import pytest

from pvlab import libvirtd, netns_bmc, process, provision
from pvlab.bmc import BMC_PASSWORD, BMC_USER
from pvlab.layout import SERVER_ADDRESS

pytestmark = [pytest.mark.lab, pytest.mark.slow]
NODE = "n5"  # bios, tiny image, an odd node: Redfish
EXAMPLE = provision.REPO_ROOT / "examples" / "inventory_sync.py"
READY_TIMEOUT = 300
NETNS_REDFISH_PORT = 8100  # on the lab namespace's loopback


@pytest.fixture
def redfish_in_netns(lab, tmp_path):
    """(host, port) of a sushy-emulator in the lab namespace, stopped (by PID) afterwards."""
    with netns_bmc.redfish_in_netns(lab.state, NETNS_REDFISH_PORT,
                                    tmp_path / "sushy-netns.log") as address:
        yield address


def curl(lab, token: str, *args: str) -> str:
    """The HTTP code of a curl to the lab's serve, run in the lab namespace."""
    result = process.run(["curl", "-gsS", "--max-time", "20", "-o", "/dev/null", "-w",
                          "%{http_code}", "-H", f"Authorization: Bearer {token}", *args],
                         netns=lab.netns, check=False, timeout=30)
    return result.stdout.strip()


def token(lab, role: str, folder) -> tuple[str, str]:
    """(token, path of a 0600 file holding it), made by `provisiond token create`."""
    name = f"lab-sync-{role}-{int(time.time())}"
    value = process.run(provision.provisiond_cmd(lab.state, "token", "create", "--role", role,
                                                 "--name", name)).stdout.strip()
    path = folder / f"{role}.token"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value, str(path)


def power_off(lab) -> None:
    """The lab's own hands (libvirt), not provisiond's: n5 off as other tests expect."""
    domain = libvirtd.connect(lab.state).lookupByName(lab.nodes[NODE].domain)
    if domain.isActive():
        domain.destroy()


def test_a_vm_boots_to_ready_through_the_api_only(lab, redfish_in_netns, tmp_path):
    node = lab.nodes[NODE]
    admin, admin_file = token(lab, "admin", tmp_path)
    _, operator_file = token(lab, "operator", tmp_path)
    url = lab.serve["url"]
    assert curl(lab, admin, "-X", "DELETE", f"{url}/api/v1/nodes/{NODE}") in ("204", "404")
    host, port = redfish_in_netns
    csv = tmp_path / "inventory.csv"
    csv.write_text("name,mac,ipaddr,netmask,gateway,profile,image,bmc_driver,bmc_address,"
                   "bmc_port,bmc_username,bmc_scheme,bmc_system_id\n"
                   f"{NODE},{node.mac},{node.ipaddr},255.255.255.0,{SERVER_ADDRESS},default,"
                   f"{node.image},redfish,{host},{port},{BMC_USER},http,{node.uuid}\n")
    (tmp_path / "bmc-password").write_text(BMC_PASSWORD + "\n")
    power_off(lab)
    started = time.monotonic()
    try:
        done = process.run(
            [sys.executable, str(EXAMPLE), str(csv), "--url", url, "--token-file", admin_file,
             "--operator-token-file", operator_file, "--bmc-password-file",
             str(tmp_path / "bmc-password"), "--build-overlays", "--power-on", "--wait",
             str(READY_TIMEOUT)], netns=lab.netns, check=False, timeout=READY_TIMEOUT + 60,
            cwd=provision.REPO_ROOT)
        print(done.stdout, f"({time.monotonic() - started:.1f} s)")
        assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{lab.serial_tail(NODE, 15)}"
    finally:
        power_off(lab)
        # n5's lab record back (its BMC is the lab's sushy-tools on the host's loopback,
        # not this test's emulator), with overlays to match, as later lab tests expect
        provision.register_nodes(lab.state, lab.config)
        provision.build_overlays(lab.state)
    lines = done.stdout.splitlines()
    assert lines[0] == f"{NODE}: created", lines
    assert lines[-1] == f"ready: {NODE}", lines
    phases = [line.split()[1] for line in lines if line.startswith(f"{NODE}: ")][1:]
    assert phases[0] == "dhcp" and "kernel" in phases and phases[-1] == "ready", phases
