"""power, bootdev, firmware and slurm commands with the fake driver; state shared via file."""

from __future__ import annotations

import json

import pytest

from provisiond.power.fake import read_fake_bmcs
from provisiond.power.pending import read_pending
from provisiond.states import NodePhase
from provisiond.status import record_phase
from tests.conftest import run_provisiond


@pytest.fixture
def nodes(cli):
    assert cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    return cli


def fake_state(config) -> dict:
    return read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")


def test_power_on_then_status_table_and_json(nodes, config):
    result = nodes("power", "on", "n[1-3]")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0].split() == ["NODE", "RESULT", "DETAIL"]
    status = json.loads(nodes("power", "status", "n[1-3]", "--json").out)
    assert [(s["node"], s["result"], s["detail"]) for s in status] == [
        ("n1", "ok", "on"), ("n2", "ok", "on"), ("n3", "ok", "on")]


def test_invocations_see_each_others_effects_across_processes(nodes, state_dir):
    assert run_provisiond(state_dir, "power", "on", "n1").returncode == 0
    child = run_provisiond(state_dir, "power", "status", "n[1-2]", "--json")
    assert [s["detail"] for s in json.loads(child.stdout)] == ["on", "off"]


def test_bootdev_pxe_once_is_spent_by_the_next_boot(nodes, config):
    assert nodes("bootdev", "pxe", "n1", "--uefi").code == 0
    assert fake_state(config)["n1"]["boot"] == {"device": "pxe", "persistent": False,
                                                "uefi": True}
    nodes("power", "cycle", "n1")
    nodes("power", "cycle", "n1")
    assert fake_state(config)["n1"]["boots"] == ["pxe", "disk"]


def test_failures_are_rows_and_a_nonzero_exit(nodes):
    nodes("node", "add", "n9", "--bmc-driver", "fake", "--bmc-address", "unreachable")
    nodes("node", "add", "n10")
    result = nodes("power", "off", "n[1,9-10]")
    assert result.code == 7
    rows = {line.split()[0]: line for line in result.out.splitlines()[1:]}
    assert "ok" in rows["n1"]
    assert "unreachable" in rows["n9"] and "bmc.driver is not set" in rows["n10"]


def test_unknown_node_is_one_line_error(nodes):
    result = nodes("power", "on", "n[1-5]")
    assert result.code == 3 and result.err.strip() == "provisiond: error: no such node: n[4-5]"


def test_timeout_flag_bounds_a_hung_bmc(nodes):
    """The flag is the hung BMC's deadline (a live node's answer is another test's: here a
    slow machine could miss so short a deadline)."""
    nodes("node", "add", "n8", "--bmc-driver", "fake", "--bmc-address", "hang")
    result = nodes("power", "status", "n8", "--timeout", "0.3", "--json")
    assert result.code == 7
    assert [(r["node"], r["detail"]) for r in json.loads(result.out)] == [
        ("n8", "no answer within 0.3 s")]


@pytest.mark.parametrize("verb", [("firmware", "list"), ("bootdev", "settle")])
@pytest.mark.parametrize("timeout", ["nan", "-1", "0", "inf"])
def test_a_timeout_out_of_range_is_refused_by_the_commands_that_run_no_job(nodes, verb,
                                                                           timeout):
    """As power and bootdev refuse it (their jobs check it): inf was a traceback
    (OverflowError), nan no deadline at all, -1 'no answer within -1 s' for every node,
    and 0 the default."""
    result = nodes(*verb, "n1", "--timeout", timeout)
    assert result.code == 2 and result.out == ""
    assert result.err == f"provisiond: error: timeout: {float(timeout)} is outside 0.1-86400\n"


def test_firmware_list_and_update(nodes):
    table = nodes("firmware", "list", "n1")
    assert table.out.splitlines()[0].split() == ["NODE", "RESULT", "COMPONENT", "VERSION"]
    assert "BIOS" in table.out and "1.0.0" in table.out
    assert nodes("firmware", "update", "n[1-2]", "--image", "http://127.0.0.1/b.bin").code == 0
    listed = json.loads(nodes("firmware", "list", "n2", "--json").out)
    assert {"name": "BIOS", "version": "1.1.0", "updateable": True} in listed[0]["value"]


def test_boot_once_false_gets_persistent_pxe_and_a_pending_reset(nodes, config):
    nodes("node", "set", "n2", "--no-bmc-boot-once")
    result = nodes("bootdev", "pxe", "n2")
    assert "no one-time boot" in result.out
    assert fake_state(config)["n2"]["boot"]["persistent"] is True
    assert "n2" in read_pending(config)
    assert "not ready since" in nodes("bootdev", "settle", "n2").out
    record_phase(config, "n2", NodePhase.DHCP)
    record_phase(config, "n2", NodePhase.READY)
    assert "pending reset done" in nodes("bootdev", "settle", "n2").out
    assert fake_state(config)["n2"]["boot"] == {"device": "disk", "persistent": True,
                                                "uefi": None}
    assert read_pending(config) == {}


def test_slurm_resume_and_suspend_log_to_a_file(nodes, config, tmp_path):
    log = tmp_path / "slurm.log"
    nodes("power", "on", "n1")
    assert nodes("slurm", "resume", "n[1-2]", "--log", str(log)).code == 0
    state = fake_state(config)
    assert state["n1"]["boots"] == ["disk", "pxe"] and state["n2"]["boots"] == ["pxe"]
    text = log.read_text()
    assert "slurm resume n1: ok: boot pxe once, power cycled" in text
    assert "slurm resume n2: ok: boot pxe once, power on" in text
    assert nodes("slurm", "suspend", "n[1-2]", "--log", str(log)).code == 0
    assert {s["power"] for s in fake_state(config).values()} == {"off"}


def test_slurm_failure_exits_nonzero_and_logs_the_error(nodes, tmp_path):
    nodes("node", "add", "n9", "--bmc-driver", "fake", "--bmc-address", "unreachable")
    log = tmp_path / "slurm.log"
    assert nodes("slurm", "suspend", "n[1,9]", "--log", str(log)).code != 0
    assert "slurm suspend n9: error: fake BMC of n9 is unreachable" in log.read_text()


def test_password_never_reaches_output(cli, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("hunter2-secret\n")
    cli("node", "add", "r1", "--bmc-driver", "redfish", "--bmc-address", "127.0.0.1",
        "--bmc-port", "1", "--bmc-scheme", "http", "--bmc-username", "root",
        "--bmc-password-file", str(secret))
    result = cli("power", "status", "r1", "--timeout", "3", "--json")
    assert result.code == 7 and "cannot connect" in result.out
    assert "hunter2" not in result.out + result.err


def test_a_nodes_own_password_file_wins_over_its_profiles_password(cli, tmp_path,
                                                                    redfish_bmc):
    """The node's own value wins, then its profiles' right to left (README); a profile's
    bmc_password secret won over the node's own bmc.password_file, so the one node whose
    BMC has a password of its own got 'access denied' with its file never read."""
    from tests.unit.power.redfish_bmc import PASSWORD, USER, start_redfish_bmc

    port, _ = redfish_bmc
    other, other_state = start_redfish_bmc()
    (tmp_path / "rack-pw").write_text("the-racks-password\n")
    (tmp_path / "own-pw").write_text(PASSWORD + "\n")
    assert cli("profile", "add", "rack", "--bmc-driver", "redfish", "--bmc-address",
               "127.0.0.1", "--bmc-scheme", "http", "--bmc-username", USER).code == 0
    assert cli("secret", "set", "profile", "rack", "bmc_password", "--file",
               str(tmp_path / "rack-pw")).code == 0
    assert cli("node", "add", "r1", "--profile", "rack", "--bmc-port", str(port),
               "--bmc-password-file", str(tmp_path / "own-pw")).code == 0
    assert cli("node", "add", "r2", "--profile", "rack", "--bmc-port",
               str(other.server_address[1])).code == 0
    try:
        out = cli("power", "status", "r[1-2]", "--json").out
    finally:
        other_state.release.set()
        other.shutdown()
        other.server_close()
    rows = {r["node"]: r for r in json.loads(out)}
    assert rows["r1"]["detail"] == "on"
    assert "access denied" in rows["r2"]["detail"]  # the profile's password for the others


def test_a_password_file_that_is_not_utf8_is_one_line_naming_the_file(cli, tmp_path, config):
    """It was 'internal error: UnicodeDecodeError: ... can't decode byte 0xe4 in position
    1' in the table and the job record: a byte of the password, and where it is."""
    secret = tmp_path / "pw"
    secret.write_bytes("p\u00e4ssw\u00f6rt\n".encode("latin-1"))
    cli("node", "add", "r1", "--bmc-driver", "fake", "--bmc-address", "bmc",
        "--bmc-password-file", str(secret))
    result = cli("power", "status", "r1", "--json")
    detail = json.loads(result.out)[0]["detail"]
    assert result.code == 7
    assert detail == f"node r1: bmc.password_file: {secret} is not UTF-8 text"
    job = json.loads(cli("job", "list", "--json").out)["items"][0]
    assert "0xe4" not in json.dumps(job) and "0xe4" not in result.err


def test_firmware_update_refuses_a_url_a_bmc_cannot_fetch(nodes, config):
    for url in ("ftp://127.0.0.1/b.bin", "b.bin", "http://127.0.0.1/a b.bin"):
        result = nodes("firmware", "update", "n1", "--image", url)
        assert result.code == 2 and result.err.strip() == (
            f"provisiond: error: image: firmware image {url!r}: not an http(s) URL")
    assert fake_state(config) == {}
