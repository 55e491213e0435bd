"""The IPMI driver, through pyghmi.

Quirks are settings: `port`, and `cipher_suite`. pyghmi >= 1.5 proposes RAKP-HMAC-SHA256
(suite 17) first and falls back to SHA1 only when the BMC refuses; a BMC that accepts but
answers SHA1 (virtualbmc's pyghmi server) breaks the login. `cipher_suite: 3` proposes SHA1,
and such a mismatch fails the login cleanly with a hint instead of pyghmi's struct.error.
"""

from __future__ import annotations

import socket
import struct
import time

from pyghmi import exceptions as pyghmi_exc
from pyghmi.ipmi import command as ipmi_command
from pyghmi.ipmi.private import session as ipmi_session

from provisiond.errors import BmcError, BmcUnreachable, InvalidInput, UnsupportedOperation
from provisiond.inventory.values import IPMI_PORT
from provisiond.power.base import (BmcBusy, Driver, FirmwareComponent, bmc_call,
                                   cached_per_driver)
from provisiond.states import BootDevice, PowerAction, PowerState

# pyghmi takes its two session-table locks in both orders: send_payload holds
# KEEPALIVE_SESSIONS while _xmit_packet takes WAITING_SESSIONS, and awaitresponse and
# wait_for_rsp hold WAITING_SESSIONS while _timedout resends through send_payload. With a
# thread per BMC, one resending while another sent, both waited forever, and so did every
# later IPMI call of the process (12 BMCs, loaded machine). One reentrant lock has no order.
ipmi_session.WAITING_SESSIONS = ipmi_session.KEEPALIVE_SESSIONS

POWER_STATES = {"on": PowerState.ON, "off": PowerState.OFF}
# PowerAction -> pyghmi set_power states; CYCLE is off (waited for) then on, because
# virtualbmc and many BMCs lack chassis power cycle.
POWER_REQUESTS = {
    PowerAction.ON: ["on"],
    PowerAction.OFF: ["off"],
    PowerAction.SOFT_OFF: ["shutdown"],
    PowerAction.RESET: ["reset"],
    PowerAction.CYCLE: ["off", "on"],
}
BOOT_DEVICES = {BootDevice.PXE: "network", BootDevice.DISK: "hd"}
# cipher suite -> pyghmi's `attemptedhash` for the first open-session proposal
CIPHER_SUITES = {3: 1, 17: 256}
BUSY_CODES = {0xC0}
CIPHER_MISMATCH = "the BMC answered the session handshake in another cipher suite"
GARBLED = "the BMC's answers are not IPMI"
UNREACHABLE_HINTS = ("timeout", "unreachable", "no response", "logged out")
# pyghmi gives up on a BMC that never answers after one login (two tries, each a send and
# a resend: 4-6 s), whatever the node's deadline (20 s by default). A login nobody answered
# is tried again after a pause while the deadline leaves room for a whole one.
LOGIN_SECONDS = 6.0
LOGIN_RETRY_DELAY = 1.0
SETTLE_SECONDS = 2.0  # for another thread to finish marking a failed login broken


def unanswered(exc: Exception) -> bool:
    """pyghmi's login gave up without a word: nothing came back from the BMC."""
    return str(exc).strip() in ("", "None")


def translate_error(exc: Exception, where: str, cipher_suite: int | None) -> BmcError:
    """The provisiond error for a pyghmi exception (one line, no credentials)."""
    message = " ".join(str(exc).split())[:300]
    if unanswered(exc):
        return BmcUnreachable(f"{where}: no answer to the IPMI session login")
    if CIPHER_MISMATCH in message or isinstance(exc, struct.error):
        hint = ": set bmc.cipher_suite: 3" if cipher_suite != 3 else ""
        return BmcError(f"{where}: {CIPHER_MISMATCH}{hint}")
    if isinstance(exc, pyghmi_exc.IpmiException) and exc.ipmicode in BUSY_CODES:
        return BmcBusy(f"{where}: busy")
    if isinstance(exc, (pyghmi_exc.UnsupportedFunctionality, pyghmi_exc.InvalidParameterValue)):
        return UnsupportedOperation(f"{where}: {message}")
    if isinstance(exc, OSError) or any(h in message.lower() for h in UNREACHABLE_HINTS):
        return BmcUnreachable(f"{where}: {message}")
    return BmcError(f"{where}: {message}")


_bmc_call = bmc_call(
    (pyghmi_exc.PyghmiException, struct.error, OSError),
    lambda driver, exc: translate_error(exc, driver.where, driver.settings.cipher_suite))


class CheckedSession(ipmi_session.Session):
    """pyghmi's session, except that a RAKP2 answer hashed with another algorithm than the
    one proposed fails the login (pyghmi raises struct.error and leaves the half-open
    session answering the BMC's retransmits, printing errors into other sessions' waits)."""

    def _got_rakp2(self, data):
        try:
            return super()._got_rakp2(data)
        except struct.error:
            self.onlogon({"error": CIPHER_MISMATCH})
            return -9

    def _handle_ipmi_packet(self, data, sockaddr=None, qent=None):
        # pyghmi handles each session's packets in whichever thread waits for an answer,
        # so a packet it fails to parse (cut short: IndexError, struct.error) raised in
        # another node's call, failing that node with this BMC's garbage. Dropped here,
        # as a lost packet would be; a login that then times out says why.
        try:
            return super()._handle_ipmi_packet(data, sockaddr, qent)
        except Exception as exc:  # noqa: BLE001 - whatever the garbage made pyghmi raise
            self.garbled = f"{type(exc).__name__}: {exc}"
            return -1

    def _mark_broken(self, error=None):
        # pyghmi's _mark_broken logs out (which clears `logging` and sets `broken`) before
        # it stores `errormsg`. Another thread's wait_for_rsp may be the one that breaks
        # this session, so the thread logging in can see the login over and read
        # `errormsg` before it exists: "AttributeError: ... no attribute 'errormsg'" in
        # place of the BMC's error (seen in a loaded CI run). Store it first.
        if error is None and getattr(self, "garbled", None):
            error = f"{GARBLED} ({self.garbled})"
        self.errormsg = error
        super()._mark_broken(error)


class Sha1Session(CheckedSession):
    """A session that proposes cipher suite 3 (RAKP-HMAC-SHA1) first."""

    def _initsession(self):
        super()._initsession()
        self.attemptedhash = CIPHER_SUITES[3]


class IpmiDriver(Driver):
    """One BMC over IPMI 2.0 (RMCP+)."""

    def validate(self) -> None:
        self.settings.require("address", "username", "password")
        suite = self.settings.cipher_suite
        if suite is not None and suite not in CIPHER_SUITES:
            raise InvalidInput(f"node {self.settings.node}: bmc.cipher_suite {suite} is not "
                               f"supported (use {' or '.join(map(str, CIPHER_SUITES))})")

    @property
    def where(self) -> str:
        return f"ipmi {self.settings.address}:{self.settings.port or IPMI_PORT}"

    @_bmc_call
    def get_power_state(self) -> PowerState:
        return POWER_STATES.get(self._command.get_power()["powerstate"], PowerState.UNKNOWN)

    @_bmc_call
    def set_power(self, action: PowerAction) -> None:
        requests = POWER_REQUESTS[action]
        if action is PowerAction.CYCLE and self.get_power_state() is PowerState.OFF:
            requests = ["on"]
        for state in requests:
            waited = len(requests) > 1 and state == "off"  # the off of a cycle must finish
            self._command.set_power(state, wait=max(1, int(self.remaining())) if waited else False)

    @_bmc_call
    def set_boot_device(self, device: BootDevice, persistent: bool, uefi: bool | None) -> None:
        if uefi is None:
            uefi = bool(self._command.get_bootdev().get("uefimode", False))
        result = self._command.set_bootdev(BOOT_DEVICES[device], persist=persistent,
                                           uefiboot=uefi)
        if isinstance(result, dict) and "error" in result:
            raise pyghmi_exc.IpmiException(result["error"])

    @_bmc_call
    def list_firmware(self) -> list[FirmwareComponent]:
        return [FirmwareComponent(name, str(info.get("version", "-")))
                for name, info in self._command.get_firmware()]

    def update_firmware(self, image_url: str) -> str:
        raise UnsupportedOperation(f"{self.where}: firmware update from a URL needs Redfish")

    def close(self) -> None:
        if "_command" in self.__dict__:
            try:
                self._command.ipmi_session.logout()
            except Exception:  # noqa: BLE001 - a failed logout leaves nothing to undo
                pass

    @cached_per_driver
    def _command(self) -> ipmi_command.Command:
        # Credentials go in as bytes: pyghmi keys its session cache by the values given but
        # deletes the entry by their encoded form, so str credentials leave a stale entry
        # that hands a logged-out session to the next driver for the same BMC.
        s = self.settings
        session_class = Sha1Session if s.cipher_suite == 3 else CheckedSession
        address = resolved(s.address, s.port or IPMI_PORT)
        while True:
            try:
                return open_command(session_class, address, s.username.encode(),
                                    s.password.encode(), s.port or IPMI_PORT)
            except pyghmi_exc.IpmiException as exc:
                if not unanswered(exc) or self.remaining() < LOGIN_RETRY_DELAY + LOGIN_SECONDS:
                    raise
            time.sleep(LOGIN_RETRY_DELAY)


def resolved(bmc: str, port: int) -> str:
    """The address of the BMC's host name, looked up here, in the node's own thread.

    pyghmi looks the name up again when it sends its first packet, holding the session
    table's lock, which every other session's wait takes: a slow lookup (a resolver that
    answers late) held up every other BMC's call. Given an address, it looks up nothing.
    IPv4 first: pyghmi, given a name, tried each address it has; given one, only that.
    """
    found = socket.getaddrinfo(bmc, port, 0, socket.SOCK_DGRAM)
    return min(found, key=lambda entry: entry[0] != socket.AF_INET)[4][0]


def open_command(session_class, bmc: str, userid: bytes, password: bytes,
                 port: int) -> ipmi_command.Command:
    """A logged-in pyghmi Command whose session is of `session_class`.

    pyghmi's Command always builds a plain Session, so this sets the attributes its
    __init__ sets for a synchronous remote session (pyghmi 1.5-1.6) around our own.
    """
    command = ipmi_command.Command.__new__(ipmi_command.Command)
    command.onlogon = None
    command.bmc = bmc
    command._sdrcachedir = command._sdr = command._oem = None
    command._oemknown = False
    command._netchannel = command._ipv6support = None
    command.certverify = None
    command.kwargs = {}
    command.ipmi_session = settled(session_class(bmc=bmc, userid=userid, password=password,
                                                 port=port, kg=None, privlevel=None))
    return command


def settled(session):
    """`session` once its login is over: pyghmi clears `logging` before it marks a failed
    login broken (its logout), so the constructor can return in between a session neither
    logged in nor broken. Wait, briefly, for the thread failing it to finish, then raise
    its error as pyghmi's constructor would have."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while not (session.logged or session.broken) and time.monotonic() < deadline:
        time.sleep(0.01)
    if session.logged and not session.broken:
        return session
    raise pyghmi_exc.IpmiException(getattr(session, "errormsg", None) if session.broken
                                   else "the IPMI session login ended without a session")
