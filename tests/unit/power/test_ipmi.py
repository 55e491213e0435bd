"""The ipmi driver's own logic with a pyghmi Command fake: state maps, errors, quirks."""

from __future__ import annotations

import struct
import threading

import pytest
from pyghmi import exceptions as pyghmi_exc

from provisiond.errors import BmcError, BmcUnreachable, InvalidInput, UnsupportedOperation
from provisiond.power import ipmi
from provisiond.power.base import BmcSettings
from provisiond.states import BmcDriver, BootDevice, PowerAction, PowerState


class FakeCommand:
    """Records calls like pyghmi's Command would receive them; fails on request."""

    def __init__(self, power="on"):
        self.power = power
        self.calls: list[tuple] = []
        self.failures: list[Exception] = []

    def _maybe_fail(self):
        if self.failures:
            raise self.failures.pop(0)

    def get_power(self):
        self._maybe_fail()
        return {"powerstate": self.power}

    def set_power(self, state, wait=False):
        self._maybe_fail()
        self.calls.append(("set_power", state, wait))
        self.power = {"shutdown": "off", "reset": self.power}.get(state, state)

    def get_bootdev(self):
        return {"bootdev": "default", "persistent": True, "uefimode": True}

    def set_bootdev(self, bootdev, persist=False, uefiboot=False):
        self._maybe_fail()
        self.calls.append(("set_bootdev", bootdev, persist, uefiboot))
        return {"bootdev": bootdev}

    def get_firmware(self):
        yield "BMC Version", {"version": "1.0"}


SECRET = "Pw-7f3a91-never-printed"


def driver(command: FakeCommand | None = None, **changes) -> ipmi.IpmiDriver:
    values = dict(node="n001", driver=BmcDriver.IPMI, address="127.0.0.1", port=6230,
                  username="admin", password="password", timeout=5.0)
    values.update(changes)
    result = ipmi.IpmiDriver(BmcSettings(**values))
    if command is not None:
        result.__dict__["_command"] = command
    return result


def test_power_state_table():
    assert driver(FakeCommand("on")).get_power_state() is PowerState.ON
    assert driver(FakeCommand("off")).get_power_state() is PowerState.OFF
    assert driver(FakeCommand("standby")).get_power_state() is PowerState.UNKNOWN


@pytest.mark.parametrize("action, requests", [
    (PowerAction.ON, ["on"]), (PowerAction.OFF, ["off"]), (PowerAction.SOFT_OFF, ["shutdown"]),
    (PowerAction.RESET, ["reset"]), (PowerAction.CYCLE, ["off", "on"]),
])
def test_power_actions_map_to_pyghmi_states(action, requests):
    command = FakeCommand("on")
    driver(command).set_power(action)
    assert [call[1] for call in command.calls] == requests


def test_cycle_waits_for_off_and_powers_on_an_off_node_directly():
    command = FakeCommand("on")
    driver(command).set_power(PowerAction.CYCLE)
    assert command.calls[0][2] >= 1  # the off is waited for
    command = FakeCommand("off")
    driver(command).set_power(PowerAction.CYCLE)
    assert command.calls == [("set_power", "on", False)]


def test_boot_device_keeps_the_bmc_mode_unless_told():
    command = FakeCommand()
    driver(command).set_boot_device(BootDevice.PXE, False, None)
    driver(command).set_boot_device(BootDevice.DISK, True, False)
    assert command.calls == [("set_bootdev", "network", False, True),
                             ("set_bootdev", "hd", True, False)]


def test_busy_completion_code_is_retried(monkeypatch):
    command = FakeCommand("off")
    command.failures = [pyghmi_exc.IpmiException("Node busy", code=0xC0)] * 2
    driver(command).set_power(PowerAction.ON)
    assert command.power == "on"


def test_busy_until_the_deadline_is_unreachable():
    command = FakeCommand()
    command.failures = [pyghmi_exc.IpmiException("Node busy", code=0xC0)] * 1000
    with pytest.raises(BmcUnreachable, match="stayed busy"):
        driver(command, timeout=0.5).get_power_state()


@pytest.mark.parametrize("error, expected, text", [
    (pyghmi_exc.IpmiException("timeout"), BmcUnreachable, "timeout"),
    (pyghmi_exc.IpmiException("Incorrect password provided"), BmcError, "Incorrect password"),
    (pyghmi_exc.UnsupportedFunctionality("no"), UnsupportedOperation, "no"),
    (struct.error("unpack requires a buffer of 16 bytes"), BmcError, "set bmc.cipher_suite: 3"),
    (OSError(101, "Network is unreachable"), BmcUnreachable, "unreachable"),
])
def test_library_errors_become_provisiond_errors(error, expected, text):
    command = FakeCommand()
    command.failures = [error]
    with pytest.raises(expected, match=text) as caught:
        driver(command, password=SECRET).get_power_state()
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert caught.value.__cause__ is None  # nothing chained that could hold it either


def test_firmware_update_is_unsupported_and_list_reports_the_bmc_version():
    assert [c.to_data() for c in driver(FakeCommand()).list_firmware()] == [
        {"name": "BMC Version", "version": "1.0", "updateable": None}]
    with pytest.raises(UnsupportedOperation, match="needs Redfish"):
        driver(FakeCommand()).update_firmware("http://127.0.0.1/x")


def test_validate_checks_cipher_suite_and_credentials():
    with pytest.raises(InvalidInput, match="cipher_suite 2 is not supported"):
        driver(cipher_suite=2).validate()
    with pytest.raises(InvalidInput, match="bmc.username"):
        driver(username=None).validate()
    driver(cipher_suite=3).validate()


def test_sha1_session_proposes_cipher_suite_3_first():
    plain = object.__new__(ipmi.ipmi_session.Session)
    sha1 = object.__new__(ipmi.Sha1Session)
    for session in (plain, sha1):
        session.maxtimeout, session.logontries = 2, 1
        session._initsession()
    assert plain.attemptedhash == 256 and sha1.attemptedhash == 1


def test_silent_login_failure_is_unreachable():
    command = FakeCommand()
    command.failures = [pyghmi_exc.IpmiException(None)]
    with pytest.raises(BmcUnreachable, match="no answer to the IPMI session login"):
        driver(command).get_power_state()


def test_a_login_does_not_wait_for_another_bmcs_login(monkeypatch):
    """Each driver logs in on its own: functools.cached_property (Python 3.11) held one lock
    for every driver's session, so a fan-out logged in to its BMCs one after another and a
    BMC that did not answer held up the rest until pyghmi gave up (~5 s each)."""
    entered, release = threading.Event(), threading.Event()

    def open_command(session_class, bmc, userid, password, port):
        if port == 6231:  # the BMC that does not answer yet
            entered.set()
            release.wait(30)
        return FakeCommand("off")

    monkeypatch.setattr(ipmi, "open_command", open_command)
    silent = threading.Thread(target=driver(port=6231).get_power_state, daemon=True)
    silent.start()
    assert entered.wait(10)
    states = []
    other = threading.Thread(target=lambda: states.append(driver().get_power_state()),
                             daemon=True)
    other.start()
    other.join(10)
    answered_meanwhile = list(states)
    release.set()
    silent.join(10)
    assert answered_meanwhile == [PowerState.OFF]


def logins_failing(monkeypatch, *errors: Exception) -> list[int]:
    """Patch the login: raise `errors` in turn, then log in; returns the list of attempts."""
    attempts = []

    def open_command(*args):
        attempts.append(len(attempts) + 1)
        if len(attempts) <= len(errors):
            raise errors[len(attempts) - 1]
        return FakeCommand("off")

    monkeypatch.setattr(ipmi, "open_command", open_command)
    return attempts


def test_a_login_nobody_answered_is_tried_again_while_a_whole_one_fits(monkeypatch):
    """pyghmi gives up on a silent BMC after 4-6 s; the node's deadline is longer."""
    attempts = logins_failing(monkeypatch, pyghmi_exc.IpmiException(None))
    assert driver(timeout=20.0).get_power_state() is PowerState.OFF
    assert attempts == [1, 2]


@pytest.mark.parametrize("error, timeout", [
    (pyghmi_exc.IpmiException(None), 5.0),  # too little time left for a whole login
    (pyghmi_exc.IpmiException("Incorrect password provided"), 20.0),  # an answer
])
def test_a_login_is_not_tried_again_without_time_or_after_an_answer(monkeypatch, error,
                                                                       timeout):
    attempts = logins_failing(monkeypatch, error)
    with pytest.raises(BmcError):
        driver(timeout=timeout).get_power_state()
    assert attempts == [1]


def test_pyghmi_session_locks_cannot_be_taken_in_two_orders():
    """pyghmi's send_payload holds KEEPALIVE_SESSIONS while _xmit_packet takes
    WAITING_SESSIONS; awaitresponse holds WAITING_SESSIONS while _timedout resends through
    send_payload. Two fan-out threads, one resending while the other sent, waited for each
    other forever, and with them every later IPMI call of the process. The driver makes the
    two one reentrant lock; if pyghmi stops naming them there, this fix needs a new look."""
    session = ipmi.ipmi_session
    assert {"KEEPALIVE_SESSIONS"} <= set(session.Session.send_payload.__code__.co_names)
    assert {"WAITING_SESSIONS"} <= set(session.Session.awaitresponse.__code__.co_names)
    assert {"WAITING_SESSIONS"} <= set(session.Session._xmit_packet.__code__.co_names)
    assert session.WAITING_SESSIONS is session.KEEPALIVE_SESSIONS


def test_a_broken_login_has_its_error_before_it_looks_over():
    """The thread waiting on a login reads `errormsg` once `logging` is cleared; another
    thread breaking the session must not let it look over before the error is stored."""
    session = object.__new__(ipmi.CheckedSession)
    session.lastpayload = session.onlogpayload = session.socket = None
    session.bmc, session.userid, session.password = "127.0.0.1", b"u", b"p"
    session.port, session.kgo, session.broken, session.logging = 623, None, False, True
    session.logonwaiters = []
    seen = []

    def logout(sessionok=True):  # what pyghmi's logout does to the flags, then the waiter
        session.logging, session.broken = False, True
        seen.append(getattr(session, "errormsg", "missing"))
    session.logout = logout
    session._mark_broken(ipmi.CIPHER_MISMATCH)
    assert seen == [ipmi.CIPHER_MISMATCH]
    assert session.errormsg == ipmi.CIPHER_MISMATCH and session.broken


class HalfFailedSession:
    """What pyghmi's constructor can return when another thread fails the login: `logging`
    already cleared, `broken` (and the error) set a moment later by that thread."""

    def __init__(self, error, after: float, **_login):
        self.logged, self.broken, self.logging = 0, False, False

        def fail():
            self.errormsg, self.broken = error, True
        threading.Timer(after, fail).start()


def test_a_login_failed_by_another_thread_raises_its_error(monkeypatch):
    def session_class(**login):
        return HalfFailedSession(ipmi.CIPHER_MISMATCH, 0.05, **login)
    with pytest.raises(pyghmi_exc.IpmiException, match=ipmi.CIPHER_MISMATCH):
        ipmi.open_command(session_class, "127.0.0.1", b"u", b"p", 623)
    monkeypatch.setattr(ipmi, "SETTLE_SECONDS", 0.01)
    with pytest.raises(pyghmi_exc.IpmiException, match="login ended without a session"):
        ipmi.open_command(lambda **login: HalfFailedSession("late", 1.0, **login),
                          "127.0.0.1", b"u", b"p", 623)


def test_a_logged_in_session_is_used_at_once():
    class LoggedIn:
        def __init__(self, **_login):
            self.logged, self.broken = 1, False
    command = ipmi.open_command(LoggedIn, "127.0.0.1", b"u", b"p", 623)
    assert isinstance(command.ipmi_session, LoggedIn) and command.bmc == "127.0.0.1"
