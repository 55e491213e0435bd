"""The redfish driver through the CLI against real sushy-tools emulators on loopback.

sushy-emulator runs with libvirt's built-in test driver (`test:///default`: one domain
"test", no daemon, no VM) for power, boot device and firmware, behind HTTPS with our own
CA and HTTP basic auth; and with its fake driver for many systems (see test_power_fanout).

What sushy-tools cannot show: its firmware task is a static document that is always
Completed (sushy-tools 2.2.0 and upstream HEAD 2b51921), so polling a Running task until it
ends is tested against the stand-in BMC of tests/unit/power/test_redfish.py instead.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.certs import self_signed

USER, PASSWORD = "admin", "redfish-pw"
EMULATOR = [sys.executable, "-c", "from sushy_tools.emulator.main import main; main()"]


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_emulator(directory: Path, settings: dict, tls: bool = False
                   ) -> tuple[subprocess.Popen, int, Path | None]:
    """sushy-emulator on 127.0.0.1 with `settings` (its Python config file) and basic auth."""
    directory.mkdir(parents=True, exist_ok=True)
    auth = directory / "htpasswd"
    auth.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
    # its state here, not in the machine-wide /tmp/sushy-emulator (see pvlab/bmc.py)
    settings = {"SUSHY_EMULATOR_AUTH_FILE": str(auth),
                "SUSHY_EMULATOR_STATE_DIR": str(directory / "state"), **settings}
    cert = None
    if tls:
        cert, key = self_signed(directory, stem="bmc")
        settings |= {"SUSHY_EMULATOR_SSL_CERT": str(cert), "SUSHY_EMULATOR_SSL_KEY": str(key)}
    config = directory / "emulator.conf"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in settings.items()))
    port = free_tcp_port()
    log = (directory / "emulator.log").open("w")
    proc = subprocess.Popen([*EMULATOR, "--config", str(config), "-i", "127.0.0.1",
                             "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    wait_for_emulator(proc, port, tls)
    return proc, port, cert


def wait_for_emulator(proc: subprocess.Popen, port: int, tls: bool) -> None:
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/redfish/v1"
    context = ssl._create_unverified_context()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "sushy-emulator exited"
        try:
            urllib.request.urlopen(url, timeout=1, context=context)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("sushy-emulator did not answer within 30 s")


def get_json(port: int, path: str, tls: bool = True) -> dict:
    """Read a document from the emulator ourselves, to check what the driver did."""
    request = urllib.request.Request(f"{'https' if tls else 'http'}://127.0.0.1:{port}{path}")
    token = f"{USER}:{PASSWORD}".encode()
    request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    with urllib.request.urlopen(request, context=ssl._create_unverified_context()) as reply:
        return json.loads(reply.read())


@pytest.fixture(scope="module")
def libvirt_emulator(tmp_path_factory):
    """(port, CA file) of sushy-emulator over libvirt's test:///default, HTTPS + auth."""
    directory = tmp_path_factory.mktemp("sushy-libvirt")
    proc, port, cert = start_emulator(
        directory, {"SUSHY_EMULATOR_LIBVIRT_URI": "test:///default"}, tls=True)
    yield port, cert, directory / "emulator.log"
    proc.kill()
    proc.wait(10)


@pytest.fixture
def redfish_node(cli, libvirt_emulator, tmp_path):
    port, cert, _ = libvirt_emulator
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD)
    added = cli("node", "add", "r1", "--bmc-driver", "redfish", "--bmc-address", "127.0.0.1",
                "--bmc-port", str(port), "--bmc-username", USER, "--bmc-password-file",
                str(secret), "--bmc-ca-file", str(cert))
    assert added.code == 0, added.err
    return cli


def detail(result) -> str:
    rows = json.loads(result.out)
    assert len(rows) == 1, rows
    return rows[0]["detail"]


def system_path(port: int) -> str:
    return get_json(port, "/redfish/v1/Systems")["Members"][0]["@odata.id"]


def test_power_actions_and_status(redfish_node, libvirt_emulator):
    port, _, _ = libvirt_emulator
    for action, state in [("off", "off"), ("on", "on"), ("cycle", "on"), ("reset", "on"),
                          ("soft-off", "off"), ("cycle", "on")]:
        result = redfish_node("power", action, "r1", "--json")
        assert result.code == 0, (action, result.out)
        assert detail(redfish_node("power", "status", "r1", "--json")) == state, action
    assert get_json(port, system_path(port))["PowerState"] == "On"


def test_boot_device_through_the_system_name_redirect(redfish_node, libvirt_emulator):
    port, _, _ = libvirt_emulator
    redfish_node("node", "set", "r1", "--bmc-system-id", "test")  # 307 to the UUID
    assert redfish_node("bootdev", "pxe", "r1").code == 0
    assert get_json(port, system_path(port))["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    assert redfish_node("bootdev", "disk", "r1", "--persistent").code == 0
    boot = get_json(port, system_path(port))["Boot"]
    assert (boot["BootSourceOverrideTarget"], boot["BootSourceOverrideEnabled"]) == \
        ("Hdd", "Continuous")


def test_firmware_update_reads_the_task_sushy_tools_reports_completed(redfish_node,
                                                                     libvirt_emulator):
    """sushy-tools answers SimpleUpdate with 204 and the URL of a task that is already
    Completed: the driver must read that task (sushy reads it once more when it makes its
    task monitor) and report it."""
    log = libvirt_emulator[2]
    task_fetches = lambda: log.read_text().count("GET /redfish/v1/TaskService/Tasks/42 ")
    before = task_fetches()
    listed = json.loads(redfish_node("firmware", "list", "r1", "--json").out)[0]["value"]
    bios = next(c["version"] for c in listed if c["name"] == "BIOS")
    major, minor, patch = bios.split(".")
    result = redfish_node("firmware", "update", "r1", "--image",
                          "http://127.0.0.1:9/bios-2.0.bin", "--json")
    assert result.code == 0, result.out
    assert detail(result) == "task 42 Completed"
    assert task_fetches() > before
    listed = json.loads(redfish_node("firmware", "list", "r1", "--json").out)[0]["value"]
    assert {"name": "BIOS", "version": f"{major}.{int(minor) + 1}.{patch}",
            "updateable": None} in listed


def test_firmware_update_with_a_login_in_the_url(redfish_node, config, monkeypatch):
    """The password of the image server, from stdin, reaches sushy-tools (which takes the
    update) and no job record nor output (sushy-tools keeps no ImageURI to compare: the
    stand-in BMC of tests/unit/jobs/test_job_secrets.py checks the URL it gets)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("fw-S3cret\n"))
    result = redfish_node("firmware", "update", "r1", "--image",
                          "http://fw@127.0.0.1:9/bios-2.0.bin", "--image-password-stdin",
                          "--json")
    assert result.code == 0, result.out + result.err
    assert detail(result) == "task 42 Completed"
    record = (config.state_dir / "jobs" / "1.json").read_text()
    assert "S3cret" not in result.out + result.err + record
    assert json.loads(record)["params"]["image"] == "http://127.0.0.1:9/bios-2.0.bin"


def test_tls_verification_settings(redfish_node):
    redfish_node("node", "set", "r1", "--bmc-ca-file", "")
    failed = redfish_node("power", "status", "r1", "--json")
    assert failed.code == 7 and "TLS certificate not trusted" in detail(failed)
    redfish_node("node", "set", "r1", "--no-bmc-verify-tls")
    assert detail(redfish_node("power", "status", "r1", "--json")) in ("on", "off")


def test_wrong_password(redfish_node, tmp_path):
    (tmp_path / "pw").write_text("wrong-pw")
    result = redfish_node("power", "status", "r1", "--json")
    assert result.code == 7 and "access denied" in detail(result)
    assert "wrong-pw" not in result.out
