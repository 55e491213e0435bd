"""The redfish driver against captured Redfish documents served on 127.0.0.1."""

from __future__ import annotations


import pytest
from tests.unit.power.redfish_bmc import MONITOR, PASSWORD, SYSTEM, USER

from provisiond.errors import BmcError, BmcUnreachable, InvalidInput, UnsupportedOperation
from provisiond.power.base import BmcSettings
from provisiond.power.redfish import RedfishDriver
from provisiond.states import BmcDriver, BootDevice, PowerAction, PowerState


def driver(port: int, **changes) -> RedfishDriver:
    values = dict(node="n001", driver=BmcDriver.REDFISH, address="127.0.0.1", port=port,
                  scheme="http", username=USER, password=PASSWORD, timeout=10.0)
    values.update(changes)
    return RedfishDriver(BmcSettings(**values))


def test_power_state_and_actions_use_the_translation_table(redfish_bmc):
    port, state = redfish_bmc
    bmc = driver(port)
    assert bmc.get_power_state() is PowerState.ON
    bmc.set_power(PowerAction.SOFT_OFF)
    bmc.set_power(PowerAction.CYCLE)
    resets = [body["ResetType"] for method, path, body in state.requests
              if path.endswith("ComputerSystem.Reset")]
    assert resets == ["GracefulShutdown", "PowerCycle"]
    assert driver(port).get_power_state() is PowerState.ON


def test_cycle_without_power_cycle_is_off_wait_on(redfish_bmc):
    port, state = redfish_bmc
    allowed = ["On", "ForceOff", "ForceRestart", "GracefulShutdown"]
    state.system["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = allowed
    driver(port).set_power(PowerAction.CYCLE)
    resets = [body["ResetType"] for _, path, body in state.requests if path.endswith("Reset")]
    assert resets == ["ForceOff", "On"]


def test_unsupported_reset_type_is_unsupported_operation(redfish_bmc):
    port, state = redfish_bmc
    state.system["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = ["On"]
    with pytest.raises(UnsupportedOperation, match="allows only On"):
        driver(port).set_power(PowerAction.SOFT_OFF)


def test_boot_device_once_and_persistent_with_mode(redfish_bmc):
    port, state = redfish_bmc
    driver(port).set_boot_device(BootDevice.PXE, persistent=False, uefi=None)
    assert state.system["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    assert state.system["Boot"]["BootSourceOverrideEnabled"] == "Once"
    assert "BootSourceOverrideMode" not in state.requests[-1][2]["Boot"]
    driver(port).set_boot_device(BootDevice.DISK, persistent=True, uefi=False)
    assert state.system["Boot"].items() >= {"BootSourceOverrideTarget": "Hdd",
                                            "BootSourceOverrideEnabled": "Continuous",
                                            "BootSourceOverrideMode": "Legacy"}.items()


def test_system_name_redirect_is_followed(redfish_bmc):
    port, state = redfish_bmc
    bmc = driver(port, system_id="n001-alias")
    assert bmc.get_power_state() is PowerState.ON
    bmc.set_boot_device(BootDevice.PXE, False, True)
    assert state.system["Boot"]["BootSourceOverrideMode"] == "UEFI"
    assert ("PATCH", "/redfish/v1/Systems/n001-alias", state.requests[-2][2]) in state.requests


def test_more_than_one_system_needs_system_id(redfish_bmc):
    port, state = redfish_bmc
    state.extra_systems = ["/redfish/v1/Systems/System.Embedded.2"]
    with pytest.raises(BmcError, match="has 2 systems: set bmc.system_id"):
        driver(port).get_power_state()
    assert driver(port, system_id="System.Embedded.1").get_power_state() is PowerState.ON


def test_firmware_inventory_from_update_service(redfish_bmc):
    port, _ = redfish_bmc
    components = {c.name: c.version for c in driver(port).list_firmware()}
    assert components == {"BIOS": "2.19.1",
                          "Integrated Dell Remote Access Controller": "7.00.00.171"}


def test_firmware_without_inventory_falls_back_to_system_and_manager(redfish_bmc):
    port, state = redfish_bmc
    state.without_firmware_inventory = True
    components = {c.name: c.version for c in driver(port).list_firmware()}
    assert components == {"BIOS": "2.19.1", "BMC iDRAC.Embedded.1": "7.00.00.171"}


def test_firmware_update_follows_the_task_to_completion(redfish_bmc):
    port, state = redfish_bmc
    summary = driver(port).update_firmware("http://127.0.0.1/bios.exe")
    assert summary.startswith("task JID_873593526120 Completed")
    post = [b for m, p, b in state.requests if m == "POST" and "SimpleUpdate" in p][0]
    assert post == {"ImageURI": "http://127.0.0.1/bios.exe", "TransferProtocol": "HTTP",
                    "Targets": [SYSTEM]}
    assert [p for _, p, _ in state.requests].count(MONITOR) == 3


def test_failed_task_is_bmc_error_with_its_message(redfish_bmc):
    port, state = redfish_bmc
    state.task_end = "task_exception.json"
    with pytest.raises(BmcError, match="task Exception: Unable to verify Update Package"):
        driver(port).update_firmware("https://127.0.0.1/bios.exe")


def test_task_still_running_at_deadline_is_unreachable(redfish_bmc):
    port, state = redfish_bmc
    state.task_polls_running = 100
    with pytest.raises(BmcUnreachable, match="still running at the deadline"):
        driver(port, timeout=1.0).update_firmware("http://127.0.0.1/bios.exe")


def test_busy_bmc_is_retried_until_it_answers(redfish_bmc):
    port, state = redfish_bmc
    bmc = driver(port)
    bmc.get_power_state()
    state.busy_left = 2
    bmc.set_power(PowerAction.OFF)
    assert state.system["PowerState"] == "Off"


def test_bmc_busy_past_the_deadline_is_unreachable(redfish_bmc):
    """Retried while busy, then given up at the deadline: long before the BMC would have
    answered (1,000 busy answers at one retry per 50 ms outlast a 1 s deadline)."""
    port, state = redfish_bmc
    state.busy_left = 1000
    with pytest.raises(BmcUnreachable, match="stayed busy"):
        driver(port, timeout=1.0).get_power_state()
    assert 1 < 1000 - state.busy_left < 1000


def test_wrong_password_is_one_clear_error_without_the_password(redfish_bmc):
    port, _ = redfish_bmc
    with pytest.raises(BmcError) as caught:
        driver(port, password="wrong-one").get_power_state()
    assert "access denied" in str(caught.value)
    assert "wrong-one" not in str(caught.value) and PASSWORD not in str(caught.value)


def test_nothing_listening_is_unreachable():
    with pytest.raises(BmcUnreachable, match="cannot connect"):
        driver(1, timeout=3.0).get_power_state()


def test_validate_never_contacts_the_bmc(tmp_path):
    with pytest.raises(InvalidInput, match="password"):
        driver(1, password=None).validate()
    with pytest.raises(InvalidInput, match="ca_file"):
        driver(1, ca_file=str(tmp_path / "missing.pem")).validate()
    driver(1).validate()


def test_ipv6_address_is_bracketed():
    assert driver(8000, address="::1").base_url == "http://[::1]:8000"
    assert driver(None, scheme="https").base_url == "https://127.0.0.1:443"
