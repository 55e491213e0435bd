"""`provisiond doctor`: each problem it looks for, made real on loopback (a port held by a
socket, a BMC port nothing listens on, a stand-in Redfish BMC, a serve holding its ports),
found with its fix; a healthy state passes (exit 0)."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "boot"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "boot"))

from bootdata import add_blob, add_image, add_nodes, mac_of  # noqa: E402
from provisiond.cli.init import SHIPPED_PROFILES, import_profiles  # noqa: E402
from provisiond.config import load_config  # noqa: E402
from provisiond.inventory import InventoryStore  # noqa: E402
from provisiond.inventory.model import Bmc, NetDev, Record  # noqa: E402
from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore  # noqa: E402
from provisiond.overlays import build_overlays  # noqa: E402
from servers import free_port, start_serve, stop_serve, wait_http, write_config  # noqa: E402
from tests.unit.power.redfish_bmc import PASSWORD, USER, start_redfish_bmc  # noqa: E402

PREFLIGHT_FAILED = 9


@pytest.fixture
def healthy(state_dir):
    """Three nodes with MACs and addresses, their image (test blobs) and overlays built,
    HTTP and TFTP on free loopback ports, DHCP and DNS off."""
    write_config(state_dir, http={"bind": "127.0.0.1", "port": free_port()},
                 tftp={"enabled": True, "bind": "127.0.0.1",
                       "port": free_port(socket.SOCK_DGRAM)})
    config = load_config(state_dir)
    import_profiles(config, SHIPPED_PROFILES)
    add_nodes(config, 3)
    with InventoryStore(config).edit() as inv:  # the shipped overlays, system and runtime
        for record in inv.nodes.values():
            record.profiles = ["default"]
    add_image(config, "tiny")
    build_overlays(config)
    return load_config(state_dir)


def doctor(cli, *args: str) -> tuple[int, list[dict]]:
    result = cli("doctor", "--json", *args)
    assert result.err == "", result.err
    return result.code, json.loads(result.out)


def problems(findings: list[dict], level: str = "fail") -> dict[tuple[str, str], dict]:
    return {(f["check"], f["subject"]): f for f in findings if f["level"] == level}


def test_a_healthy_setup_passes(cli, healthy):
    code, findings = doctor(cli)
    assert code == 0 and not problems(findings), problems(findings)
    checks = {f["check"] for f in findings}
    assert {"settings", "listener", "ipxe", "mac", "image", "overlays"} <= checks
    text = cli("doctor")
    assert text.code == 0 and "nothing stops a boot" in text.out


def test_a_missing_image(cli, healthy):
    with InventoryStore(healthy).edit() as inv:
        inv.nodes["n2"].image = "debian12"
    code, findings = doctor(cli)
    found = problems(findings)[("image", "n2")]
    assert code == PREFLIGHT_FAILED and "debian12: not built" in found["detail"]
    assert found["fix"] == "provisiond image build debian12 (as root)"


def test_a_missing_blob_of_a_built_image(cli, healthy):
    manifest = json.loads((healthy.images_dir / "tiny" / "manifest.json").read_text())
    (healthy.blob_dir / manifest["layers"][1]["digest"].split(":")[1]).unlink()
    code, findings = doctor(cli, "n1")
    assert code == PREFLIGHT_FAILED
    assert "1 blob(s) of its build are missing" in problems(findings)[("image", "n1")]["detail"]


def give_mounted_form(config) -> dict:
    """tiny's manifest with a mounted form (two layer blobs and a boot kit) as a build
    writes it, the overlays built again for it; the manifest."""
    path = config.images_dir / "tiny" / "manifest.json"
    manifest = json.loads(path.read_text())
    blobs = [(f"mounted layer {i}".encode(), {"file": f".provisiond/layers/{i:03d}.squashfs"})
             for i in range(len(manifest["layers"]))]
    records = [{"digest": add_blob(config, data), "size": len(data), **extra}
               for data, extra in blobs]
    kit = b"boot kit"
    manifest["mounted"] = {"boot": "mounted", "format": "squashfs", "layers": records,
                           "kit": {"digest": add_blob(config, kit), "size": len(kit),
                                   "modules": ["loop"], "format": "squashfs"}}
    path.write_text(json.dumps(manifest))
    build_overlays(config)
    return manifest


def blob_file(config, record: dict) -> Path:
    return config.blob_dir / record["digest"].split(":")[1]


def test_intact_mounted_blobs_pass(cli, healthy):
    give_mounted_form(healthy)
    code, findings = doctor(cli, "--all")
    assert code == 0, problems(findings)
    mounted = {f["subject"]: f for f in findings if f["check"] == "mounted"}
    assert set(mounted) == {"n1", "n2", "n3"}
    assert mounted["n1"]["detail"] == "tiny: boots mounted; mounted blobs intact"


def test_a_missing_mounted_blob_fails_a_mounted_boot_and_warns_an_unpacked_one(cli, healthy):
    manifest = give_mounted_form(healthy)
    blob_file(healthy, manifest["mounted"]["layers"][1]).unlink()
    with InventoryStore(healthy).edit() as inv:
        inv.nodes["n3"].kernel_args = ["provisiond.boot=unpacked"]
    code, findings = doctor(cli)
    failed, warned = problems(findings), problems(findings, "warn")
    assert code == PREFLIGHT_FAILED
    assert {s for c, s in failed if c == "mounted"} == {"n1", "n2"}
    detail = failed[("mounted", "n1")]["detail"]
    assert detail.startswith("tiny (boots mounted): layer 2's blob ") and "is missing" in detail
    assert failed[("mounted", "n1")]["fix"] == ("provisiond image build tiny (as root): it "
                                                 "packs what is missing")
    assert warned[("mounted", "n3")]["detail"].startswith("tiny (boots unpacked): layer 2")
    assert ("image", "n1") not in failed  # the cpio layers are all there


def test_a_damaged_or_cut_mounted_blob_and_no_boot_kit(cli, healthy):
    manifest = give_mounted_form(healthy)
    blob_file(healthy, manifest["mounted"]["kit"]).write_bytes(b"boot kot")  # same size
    blob_file(healthy, manifest["mounted"]["layers"][0]).write_bytes(b"cut")
    code, findings = doctor(cli, "n1")
    found = problems(findings)[("mounted", "n1")]
    assert code == PREFLIGHT_FAILED
    assert "layer 1's blob " in found["detail"] and "is 3 bytes, not 15" in found["detail"]
    assert "the boot kit's blob " in found["detail"]
    assert "does not match its digest (damaged)" in found["detail"]
    assert found["fix"].startswith("remove the blob files named above, then provisiond image")
    manifest["mounted"].pop("kit")
    (healthy.images_dir / "tiny" / "manifest.json").write_text(json.dumps(manifest))
    code, findings = doctor(cli, "n1")  # the node boots unpacked: a warning
    assert "no boot kit" in problems(findings, "warn")[("mounted", "n1")]["detail"]


def test_a_recipe_changed_since_the_build_is_a_warning(cli, healthy, tmp_path):
    recipes = tmp_path / "recipes"
    (recipes / "tiny").mkdir(parents=True)
    (recipes / "tiny" / "image.yaml").write_text("layers: [{kind: busybox}]\n")
    write_config(healthy.state_dir, image_dirs=[str(recipes)])
    code, findings = doctor(cli, "n1")
    assert code == 0, problems(findings)
    assert "changed since the build" in problems(findings, "warn")[("image", "n1")]["detail"]


def test_an_unbuilt_overlay(cli, healthy):
    with InventoryStore(healthy).edit() as inv:  # n3's network overlay now differs
        inv.nodes["n3"].netdevs["eth0"].mac = "52:54:00:33:33:33"
    code, findings = doctor(cli)
    found = problems(findings)
    assert code == PREFLIGHT_FAILED and set(found) == {("overlays", "n3")}, found
    assert found[("overlays", "n3")]["fix"] == "provisiond overlay build n3"


def test_a_node_without_a_mac_and_one_without_an_address(cli, healthy):
    write_config(healthy.state_dir, dhcp={"enabled": False})
    with InventoryStore(healthy).edit() as inv:
        inv.nodes["n4"] = Record(image="tiny", netdevs={"eth0": NetDev(ipaddr="10.99.0.9")})
        inv.nodes["n5"] = Record(image="tiny", netdevs={"eth0": NetDev(mac=mac_of(5))})
    code, findings = doctor(cli, "n[4-5]", "--no-bmc")
    assert code == PREFLIGHT_FAILED
    assert "no netdev has a MAC" in problems(findings)[("mac", "n4")]["detail"]
    assert ("address", "n5") not in problems(findings)  # DHCP is off: another one gives it
    address = _free_loopback()
    write_config(healthy.state_dir, server={"address": address},
                 dhcp={"enabled": True, "bind": address, "port": free_port(socket.SOCK_DGRAM)})
    _, findings = doctor(cli, "n5")
    assert "eth0: a MAC but no IPv4 address" in problems(findings)[("address", "n5")]["detail"]


def test_a_busy_port(cli, healthy):
    taken = socket.socket()  # the port the settings (and the built overlays) name
    taken.bind(("127.0.0.1", healthy.http.port))
    taken.listen()
    try:
        code, findings = doctor(cli)
    finally:
        taken.close()
    assert code == PREFLIGHT_FAILED and len(problems(findings)) == 1, problems(findings)
    (key, found), = problems(findings).items()
    assert key[0] == "listener", found
    assert f"pid {os.getpid()}" in found["detail"] and "set http.port" in found["fix"]


@pytest.mark.skipif(os.geteuid() != 0, reason="binds UDP port 67")
def test_a_busy_dhcp_port_67(cli, healthy):
    address = _free_loopback()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((address, 67))
        write_config(healthy.state_dir, server={"address": address},
                     dhcp={"enabled": True, "bind": address, "port": 67})
        code, findings = doctor(cli, "--no-bmc")
    found = problems(findings)[("listener", f"dhcp udp {address}:67")]
    assert code == PREFLIGHT_FAILED and "port 67 is in use" in found["detail"]


def test_ports_held_by_provisiond_serve_are_fine(cli, healthy):
    proc = start_serve(healthy.state_dir)
    try:
        wait_http(f"http://127.0.0.1:{healthy.http.port}/boot/ipxe", proc)
        code, findings = doctor(cli)
    finally:
        stop_serve(proc)
    assert code == 0, problems(findings)
    held = [f["detail"] for f in findings if f["check"] == "listener"]
    assert held and all(d.startswith("in use by provisiond serve (pid ") for d in held), held


def test_an_address_not_on_this_host_and_a_missing_interface(cli, healthy):
    write_config(healthy.state_dir, tftp={"bind": "192.0.2.77"},
                 dhcp={"enabled": True, "interface": "pvnope0", "port": free_port(
                     socket.SOCK_DGRAM), "bind": "127.0.0.1"})
    code, findings = doctor(cli, "--no-bmc")
    found = problems(findings)
    assert code == PREFLIGHT_FAILED
    tftp = next(v for (c, s), v in found.items() if c == "listener" and s.startswith("tftp"))
    assert "192.0.2.77 is not an address of this host" in tftp["detail"]
    assert "no such network interface" in found[("interface", "pvnope0")]["detail"]
    assert "lo" in found[("interface", "pvnope0")]["fix"]  # names the ones there are


def test_discovery_on_without_the_discovery_image(cli, healthy):
    """Unknown machines boot the discovery image: with discovery on and it not built, every
    one of them loops on 'no image named discovery has been built' at its console, while
    doctor said 'nothing stops a boot'."""
    write_config(healthy.state_dir, dhcp={"enabled": True, "bind": "127.0.0.1",
                                          "port": free_port(socket.SOCK_DGRAM),
                                          "discovery": True},
                 discovery={"pool": "10.0.9.200-10.0.9.250"})
    code, findings = doctor(cli, "--no-bmc")
    found = problems(findings)[("discovery", "discovery")]
    assert code == PREFLIGHT_FAILED and "not built" in found["detail"]
    assert found["fix"] == "provisiond image build discovery (as root)"
    add_image(healthy, "discovery")
    code, findings = doctor(cli, "--no-bmc")
    assert ("discovery", "discovery") not in problems(findings)
    assert any(f["check"] == "discovery" for f in findings)


def test_missing_ipxe_binaries(cli, healthy, tmp_path):
    empty = tmp_path / "ipxe"
    empty.mkdir()
    write_config(healthy.state_dir, tftp={"root": str(empty)})
    code, findings = doctor(cli)
    found = problems(findings)[("ipxe", str(empty))]
    assert code == PREFLIGHT_FAILED
    assert "undionly.kpxe, snponly.efi, ipxe.efi" in found["detail"]
    assert "ipxe package" in found["fix"]


def test_an_unreachable_bmc_and_a_reachable_one(cli, healthy):
    server, state = start_redfish_bmc()
    closed = free_port()  # nothing listens there
    try:
        with InventoryStore(healthy).edit() as inv:
            for name, port in (("n1", server.server_address[1]), ("n2", closed)):
                inv.nodes[name].bmc = Bmc(driver="redfish", address="127.0.0.1", port=port,
                                          scheme="http", username=USER)
        SecretStore(healthy).set("nodes", ["n1", "n2"], BMC_PASSWORD, PASSWORD)
        code, findings = doctor(cli, "--bmc-timeout", "2")
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
    assert code == PREFLIGHT_FAILED
    assert set(problems(findings)) == {("bmc", "n2")}, problems(findings)
    assert "cannot connect" in problems(findings)[("bmc", "n2")]["detail"]
    assert [f["detail"] for f in findings if f["subject"] == "n1" and f["check"] == "bmc"] \
        == [f"redfish 127.0.0.1:{server.server_address[1]}: power on"]
    assert PASSWORD not in json.dumps(findings)


def test_a_file_the_service_user_does_not_own(cli, healthy):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    from provisiond.cli.ownership import hand_back

    hand_back(healthy.state_dir, 64123, 64123)
    stray = healthy.state_dir / "edited-by-root.yaml"
    stray.write_text("{}")
    os.chown(stray, 0, 0)
    code, findings = doctor(cli, "--no-bmc")
    found = problems(findings)[("state-dir", str(healthy.state_dir))]
    assert code == PREFLIGHT_FAILED and str(stray) in found["detail"]


def test_an_unknown_node_and_bad_flags(cli, healthy):
    code, findings = doctor(cli, "n[1-2],nope")
    assert code == PREFLIGHT_FAILED and ("node", "nope") in problems(findings)
    bad = cli("doctor", "--bmc-timeout", "0")
    assert bad.code == 2 and bad.err.count("\n") == 1


def _free_loopback() -> str:
    return f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.1"


def test_the_table_names_each_problem_and_its_fix(cli, healthy):
    with InventoryStore(healthy).edit() as inv:
        inv.nodes["n2"].image = "debian12"
    result = cli("doctor", "n2")
    lines = result.out.splitlines()
    assert result.code == PREFLIGHT_FAILED and lines[0].split() == ["STATUS", "CHECK",
                                                                    "SUBJECT", "PROBLEM"]
    row = next(i for i, line in enumerate(lines) if line.startswith("FAIL    image"))
    assert lines[row + 1].strip() == "fix: provisiond image build debian12 (as root)"
    assert lines[-1].endswith("2 failed, 0 warning(s)")  # the image, so the overlays


def test_a_node_asking_mounted_of_an_image_that_cannot_is_a_warning(cli, healthy):
    """provisiond.boot=mounted on a node whose image's kernel lacks the modules: the node
    boots unpacked, and doctor said 'boots unpacked; mounted blobs intact' as if asked."""
    path = healthy.images_dir / "tiny" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["mounted"] = {"boot": "unpacked", "format": "squashfs", "layers": [],
                           "unavailable": "the kernel has no module squashfs"}
    path.write_text(json.dumps(manifest))
    build_overlays(healthy)
    with InventoryStore(healthy).edit() as inv:
        inv.nodes["n2"].kernel_args = ["provisiond.boot=mounted"]
    code, findings = doctor(cli)
    warned = problems(findings, "warn")
    assert code == 0 and {s for c, s in warned if c == "mounted"} == {"n2"}
    assert warned[("mounted", "n2")]["detail"] == (
        "tiny boots unpacked, not mounted as provisiond.boot=mounted asks: the kernel has no "
        "module squashfs")
