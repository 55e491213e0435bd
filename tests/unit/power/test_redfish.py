"""The redfish driver's own logic against a stand-in BMC on 127.0.0.1 (redfish_bmc.py) that
serves documents captured from sushy-tools, and derived or hand-written ones where
sushy-tools has none (tests/fixtures/redfish/README.md). The real sushy-tools runs in
tests/integration/test_power_redfish.py."""

from __future__ import annotations

import pytest
from sushy import exceptions as sushy_exc
from tests.unit.power.redfish_bmc import PASSWORD, SYSTEM, TASK, USER, load

from provisiond.errors import BmcError, BmcUnreachable, InvalidInput, UnsupportedOperation
from provisiond.power.base import BmcSettings
from provisiond.power.redfish import RedfishDriver, translate_error
from provisiond.states import BmcDriver, BootDevice, PowerAction, PowerState


def driver(port: int, **changes) -> RedfishDriver:
    values = dict(node="n001", driver=BmcDriver.REDFISH, address="127.0.0.1", port=port,
                  scheme="http", username=USER, password=PASSWORD, timeout=10.0)
    values.update(changes)
    return RedfishDriver(BmcSettings(**values))


def resets(state) -> list[str]:
    return [body["ResetType"] for _, path, body in state.requests if path.endswith("Reset")]


def allowed_resets(state) -> list[str]:
    return state.system["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"]


def test_power_state_and_actions_use_the_translation_table(redfish_bmc):
    port, state = redfish_bmc
    bmc = driver(port)
    assert bmc.get_power_state() is PowerState.ON
    bmc.set_power(PowerAction.SOFT_OFF)
    bmc.set_power(PowerAction.RESET)
    bmc.set_power(PowerAction.ON)
    assert resets(state) == ["GracefulShutdown", "ForceRestart", "On"]
    assert driver(port).get_power_state() is PowerState.ON


def test_cycle_on_sushy_tools_which_lacks_power_cycle_is_off_wait_on(redfish_bmc):
    port, state = redfish_bmc
    assert "PowerCycle" not in allowed_resets(state)  # as captured
    driver(port).set_power(PowerAction.CYCLE)
    assert resets(state) == ["ForceOff", "On"]


def test_cycle_where_the_bmc_allows_power_cycle_is_one_reset(redfish_bmc):
    port, state = redfish_bmc
    allowed_resets(state).append("PowerCycle")
    driver(port).set_power(PowerAction.CYCLE)
    assert resets(state) == ["PowerCycle"]


def test_unsupported_reset_type_is_unsupported_operation(redfish_bmc):
    port, state = redfish_bmc
    allowed_resets(state)[:] = ["On"]
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
    bmc = driver(port, system_id="test")  # the domain's name: sushy-tools answers 307
    assert bmc.get_power_state() is PowerState.ON
    bmc.set_boot_device(BootDevice.PXE, False, True)
    assert state.system["Boot"]["BootSourceOverrideMode"] == "UEFI"
    assert ("PATCH", "/redfish/v1/Systems/test", state.requests[-2][2]) in state.requests


def test_more_than_one_system_needs_system_id(redfish_bmc):
    port, state = redfish_bmc
    state.extra_systems = ["/redfish/v1/Systems/another"]
    with pytest.raises(BmcError, match="has 2 systems: set bmc.system_id"):
        driver(port).get_power_state()
    assert driver(port, system_id=SYSTEM.rsplit("/", 1)[1]).get_power_state() is PowerState.ON


def test_firmware_inventory_from_update_service(redfish_bmc):
    port, _ = redfish_bmc  # hand-written: sushy-tools has no FirmwareInventory
    components = {(c.name, c.version, c.updateable) for c in driver(port).list_firmware()}
    assert components == {("System BIOS", "2.19.1", True), ("BMC firmware", "7.00.00.171", False)}


def test_firmware_without_inventory_falls_back_to_system_and_manager(redfish_bmc):
    port, state = redfish_bmc
    state.without_firmware_inventory = True  # as sushy-tools: 404
    components = {c.name: c.version for c in driver(port).list_firmware()}
    manager = load("captured/manager.json")
    assert components == {"BIOS": load("captured/system.json")["BiosVersion"],
                          f"BMC {manager['Id']}": manager["FirmwareVersion"]}


def test_firmware_update_polls_a_running_task_until_it_completes(redfish_bmc):
    port, state = redfish_bmc
    state.task_polls_running = 2
    summary = driver(port).update_firmware("http://127.0.0.1/bios.exe")
    assert summary == "task 42 Completed"
    post = [b for m, p, b in state.requests if m == "POST" and "SimpleUpdate" in p][0]
    assert post == {"ImageURI": "http://127.0.0.1/bios.exe", "TransferProtocol": "HTTP",
                    "Targets": [SYSTEM]}
    assert [p for _, p, _ in state.requests].count(TASK) == 3  # Running, Running, Completed
    assert state.task_polls_running == 0


def test_failed_task_is_bmc_error_with_its_message(redfish_bmc):
    port, state = redfish_bmc
    state.task_end = "derived/task_exception.json"
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


@pytest.mark.parametrize("path,body", [
    ("/redfish/v1", b"<html><body>Web UI login</body></html>"),  # a web UI, not Redfish
    (SYSTEM, b"[1, 2, 3]"),  # JSON, but no Redfish document
    (SYSTEM, b'{"@odata.id": '),  # cut short
])
def test_an_answer_that_is_not_redfish_is_a_bmc_error(redfish_bmc, path, body):
    """sushy lets requests' JSONDecodeError (or an AttributeError on a JSON list) out: it
    reached the table as 'internal error', counted as a bug of ours."""
    port, state = redfish_bmc
    state.raw[path] = body
    with pytest.raises(BmcError, match="the answer is not Redfish") as caught:
        driver(port).get_power_state()
    assert "\n" not in str(caught.value)


def test_nothing_listening_is_unreachable():
    with pytest.raises(BmcUnreachable, match="cannot connect"):
        driver(1, timeout=3.0).get_power_state()


# What requests says, through sushy, of a BMC host name that does not resolve, and of a
# connect that timed out (urllib3 2.x), each past 300 characters with a long host name.
HOST = "bmc-rack12-chassis03-slot07.mgmt.example.org"
UNRESOLVED = (
    f"HTTPSConnectionPool(host='{HOST}', port=443): Max retries exceeded with url: "
    "/redfish/v1/ (Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection "
    f"object at 0x7f5e2c1d0a90>: Failed to resolve '{HOST}' ([Errno -2] Name or service "
    "not known)\"))")
TIMED_OUT = (
    f"HTTPSConnectionPool(host='{HOST}', port=443): Max retries exceeded with url: "
    "/redfish/v1/ (Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection object "
    f"at 0x7f5e2c1d0a90>, 'Connection to {HOST} timed out. (connect timeout=10.0)'))")


@pytest.mark.parametrize("error,reason", [(UNRESOLVED, "unknown host name"),
                                          (TIMED_OUT, "timed out")])
def test_the_reason_a_connection_failed_is_found_past_300_characters(error, reason):
    exc = sushy_exc.ConnectionError(url=f"https://{HOST}:443/redfish/v1/", error=error)
    assert len(str(exc)) > 300
    translated = translate_error(exc, f"https://{HOST}:443")
    assert isinstance(translated, BmcUnreachable)
    assert str(translated) == f"https://{HOST}:443: cannot connect: {reason}"


def test_validate_never_contacts_the_bmc(tmp_path):
    with pytest.raises(InvalidInput, match="password"):
        driver(1, password=None).validate()
    with pytest.raises(InvalidInput, match="ca_file"):
        driver(1, ca_file=str(tmp_path / "missing.pem")).validate()
    driver(1).validate()


def test_ipv6_address_is_bracketed():
    assert driver(8000, address="::1").base_url == "http://[::1]:8000"
    assert driver(None, scheme="https").base_url == "https://127.0.0.1:443"


def test_a_bmc_that_never_answers_does_not_hold_up_another_drivers_first_request(redfish_bmc):
    """Each driver opens its own service root: functools.cached_property (3.11) locked one
    property for every instance, so a fan-out met its BMCs one after another."""
    import socket
    import threading

    port, _ = redfish_bmc
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hanging = driver(silent.getsockname()[1], timeout=8.0)
        outcome = []
        thread = threading.Thread(target=lambda: outcome.append(_power_or_error(hanging)))
        thread.start()
        try:
            while not thread.is_alive():
                pass
            assert driver(port).get_power_state() is PowerState.ON
            assert thread.is_alive() and not outcome  # the silent BMC is still being waited on
        finally:
            thread.join(30)
    assert isinstance(outcome[0], BmcUnreachable), outcome


def _power_or_error(bmc: RedfishDriver):
    try:
        return bmc.get_power_state()
    except BmcUnreachable as exc:
        return exc
