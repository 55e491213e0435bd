"""The Redfish driver, through sushy.

BMC quirks are settings: `system_id` (else the only system), `scheme`, `verify_tls`/`ca_file`;
redirects (sushy-tools sends a system name to its UUID with 307) are followed; HTTP 503 is
retried until the deadline; sushy's exceptions become provisiond errors in `_bmc_call`.
"""

from __future__ import annotations

import ipaddress
import os
import time

import sushy
from sushy import exceptions as sushy_exc
from sushy.auth import BasicAuth

from provisiond.errors import BmcError, BmcUnreachable, InvalidInput, UnsupportedOperation
from provisiond.inventory.values import REDFISH_PORTS
from provisiond.power.base import BmcBusy, Driver, FirmwareComponent, bmc_call, cached_per_driver
from provisiond.power.firmware_url import credentials_hidden
from provisiond.states import BootDevice, PowerAction, PowerState

POWER_STATES = {
    sushy.PowerState.ON: PowerState.ON,
    sushy.PowerState.POWERING_OFF: PowerState.ON,
    sushy.PowerState.OFF: PowerState.OFF,
    sushy.PowerState.POWERING_ON: PowerState.OFF,
}
# The first reset type the system allows wins; CYCLE falls back to ForceOff, wait, On.
RESET_TYPES = {
    PowerAction.ON: [sushy.ResetType.ON, sushy.ResetType.FORCE_ON],
    PowerAction.OFF: [sushy.ResetType.FORCE_OFF],
    PowerAction.SOFT_OFF: [sushy.ResetType.GRACEFUL_SHUTDOWN],
    PowerAction.RESET: [sushy.ResetType.FORCE_RESTART],
    PowerAction.CYCLE: [sushy.ResetType.POWER_CYCLE],
}
BOOT_SOURCES = {BootDevice.PXE: sushy.BootSource.PXE, BootDevice.DISK: sushy.BootSource.HDD}
BOOT_MODES = {True: sushy.BootSourceOverrideMode.UEFI, False: sushy.BootSourceOverrideMode.LEGACY}
TASK_RUNNING = {"New", "Starting", "Running", "Pending", "Suspended", "Stopping", "Service",
                "Cancelling", "Interrupted"}
TASK_OK = {"Completed"}
BUSY_STATUS = {503}
POLL_SECONDS = 1.0
# Text inside a requests/urllib3 connection error -> what to tell the user.
CONNECTION_REASONS = [
    ("CERTIFICATE_VERIFY_FAILED",
     "TLS certificate not trusted: set bmc.ca_file, or bmc.verify_tls: false"),
    ("timed out", "timed out"),
    ("Connection refused", "connection refused"),
    ("No route to host", "no route to host"),
    ("Name or service not known", "unknown host name"),
    ("Temporary failure in name resolution", "host name not resolved (no DNS answer)"),
]


# What sushy lets out of an answer that is no Redfish document (a web UI's HTML page, a
# JSON list, a body cut short): requests' JSONDecodeError, or Python's own errors of
# sushy's code reading fields of what it took for an object.
ANSWER_ERRORS = (ValueError, AttributeError, TypeError, KeyError, IndexError)
ANSWER_READERS = ("sushy", "requests", "json", "simplejson")


def read_from_answer(exc: Exception) -> bool:
    """Whether `exc` (one of ANSWER_ERRORS) was raised reading a BMC's answer: in sushy or
    a JSON decoder, not in our own code (a bug of ours stays one)."""
    trace = exc.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    module = trace.tb_frame.f_globals.get("__name__", "") if trace else ""
    return module.partition(".")[0] in ANSWER_READERS


def translate_error(exc: Exception, where: str) -> Exception:
    """The provisiond error for a sushy exception (one line, no credentials); an error
    of our own code comes back as it is."""
    text = " ".join(str(exc).split())
    message = text[:300]
    if not isinstance(exc, sushy_exc.SushyError):
        if not read_from_answer(exc):
            return exc
        return BmcError(f"{where}: the answer is not Redfish ({type(exc).__name__}: "
                        f"{message[:160]})")
    if isinstance(exc, sushy_exc.ConnectionError):
        reason = next((said for key, said in CONNECTION_REASONS if key in text),  # the
                      message[:160])  # cause comes last, often past 300 characters
        return BmcUnreachable(f"{where}: cannot connect: {reason}")
    if isinstance(exc, sushy_exc.HTTPError) and exc.status_code in BUSY_STATUS:
        return BmcBusy(f"{where}: busy ({exc.status_code})")
    if isinstance(exc, sushy_exc.AccessError):
        return BmcError(f"{where}: access denied: check bmc.username and the password")
    if isinstance(exc, (sushy_exc.MissingAttributeError, sushy_exc.MissingActionError,
                        sushy_exc.InvalidParameterValueError)):
        return UnsupportedOperation(f"{where}: {message}")
    return BmcError(f"{where}: {message}")


_bmc_call = bmc_call((sushy_exc.SushyError, *ANSWER_ERRORS),
                     lambda driver, exc: translate_error(exc, driver.base_url))


class RedfishDriver(Driver):
    """One Redfish system: power, boot override, firmware via UpdateService."""

    def validate(self) -> None:
        self.settings.require("address", "username", "password")
        if self.settings.ca_file and not os.path.isfile(self.settings.ca_file):
            raise InvalidInput(
                f"node {self.settings.node}: bmc.ca_file {self.settings.ca_file} does not exist")

    @property
    def base_url(self) -> str:
        s = self.settings
        host = s.address or ""
        try:
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
        except ValueError:
            pass
        port = s.port or REDFISH_PORTS[s.scheme]
        return f"{s.scheme}://{host}:{port}"

    @_bmc_call
    def get_power_state(self) -> PowerState:
        return POWER_STATES.get(self._system.power_state, PowerState.UNKNOWN)

    @_bmc_call
    def set_power(self, action: PowerAction) -> None:
        reset = self._reset_type(action)
        if reset is not None:
            self._system.reset_system(reset)
        else:
            self._cycle_by_off_on()

    @_bmc_call
    def set_boot_device(self, device: BootDevice, persistent: bool, uefi: bool | None) -> None:
        enabled = (sushy.BootSourceOverrideEnabled.CONTINUOUS if persistent
                   else sushy.BootSourceOverrideEnabled.ONCE)
        mode = None if uefi is None else BOOT_MODES[uefi]
        self._system.set_system_boot_options(BOOT_SOURCES[device], enabled=enabled, mode=mode)

    @_bmc_call
    def list_firmware(self) -> list[FirmwareComponent]:
        components = self._firmware_inventory()
        if components is None:
            components = self._versions_from_system_and_managers()
        return components

    @_bmc_call
    def update_firmware(self, image_url: str) -> str:
        # a BMC's refusal may quote the URL: its password goes before translate_error cuts
        # the message to one line (a cut inside it would leave its start)
        with credentials_hidden(image_url):
            service = self._root.get_update_service()
            protocol = "HTTPS" if image_url.lower().startswith("https:") else "HTTP"
            monitor = service.simple_update(image_url, targets=[self._system.path],
                                            transfer_protocol=protocol)
            return self._follow_task(monitor)

    @cached_per_driver
    def _root(self) -> sushy.Sushy:
        s = self.settings
        verify = s.ca_file or s.verify_tls
        timeout = max(1.0, min(self.remaining(), 60.0))
        return sushy.Sushy(self.base_url, auth=BasicAuth(s.username, s.password),
                           verify=verify, read_timeout=timeout,
                           connect_timeout=min(timeout, 10.0),
                           server_side_retries=1, server_side_retries_delay=1)

    @cached_per_driver
    def _system(self):
        system_id = self.settings.system_id
        if system_id is None:
            return self._only_system()
        if not system_id.startswith("/"):
            system_id = f"/redfish/v1/Systems/{system_id}"
        return self._root.get_system(system_id)

    def _only_system(self):
        members = self._root.get_system_collection().members_identities
        if len(members) != 1:
            raise BmcError(f"{self.base_url}: the BMC has {len(members)} systems: "
                           f"set bmc.system_id to one of {', '.join(sorted(members))}")
        return self._root.get_system(members[0])

    def _reset_type(self, action: PowerAction):
        allowed = self._system.get_allowed_reset_system_values()
        for reset in RESET_TYPES[action]:
            if reset in allowed:
                return reset
        if action is PowerAction.CYCLE:
            return None
        raise UnsupportedOperation(
            f"{self.base_url}: power {action.value}: the system allows only "
            f"{', '.join(sorted(r.value for r in allowed))}")

    def _cycle_by_off_on(self) -> None:
        """PowerCycle where the BMC lacks it: ForceOff, wait for Off, then On."""
        if self._refreshed_power() is not PowerState.OFF:
            self._system.reset_system(sushy.ResetType.FORCE_OFF)
            while self._refreshed_power() is not PowerState.OFF:
                if time.monotonic() + POLL_SECONDS >= self.deadline:
                    raise BmcUnreachable(f"{self.base_url}: the system did not power off")
                time.sleep(POLL_SECONDS)
        self._system.reset_system(self._reset_type(PowerAction.ON))

    def _refreshed_power(self) -> PowerState:
        self._system.refresh(force=True)
        return POWER_STATES.get(self._system.power_state, PowerState.UNKNOWN)

    def _firmware_inventory(self) -> list[FirmwareComponent] | None:
        """The UpdateService's FirmwareInventory, or None where the BMC has none."""
        try:
            collection = self._root.get_update_service().firmware_inventory
            items = collection.get_members()
        except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError):
            return None
        return [FirmwareComponent(i.name or i.identity, i.version or "-", i.updateable)
                for i in items]

    def _versions_from_system_and_managers(self) -> list[FirmwareComponent]:
        components = [FirmwareComponent("BIOS", self._system.bios_version or "-")]
        for manager in self._system.managers:
            components.append(FirmwareComponent(f"BMC {manager.identity}",
                                                manager.firmware_version or "-"))
        return components

    def _follow_task(self, monitor) -> str:
        """Poll the task (or its monitor) until it ends; a failed task is a BmcError."""
        while True:
            monitor.refresh()
            response = monitor.response
            document = response.json() if response.content else {}
            state = document.get("TaskState")
            if response.status_code != 202 and state not in TASK_RUNNING:
                return self._task_result(document)
            if time.monotonic() + POLL_SECONDS >= self.deadline:
                raise BmcUnreachable(f"{self.base_url}: firmware update still running "
                                     f"at the deadline ({state or 'no state'})")
            time.sleep(POLL_SECONDS)

    def _task_result(self, document: dict) -> str:
        state = document.get("TaskState", "Completed")
        messages = "; ".join(m.get("Message", "") for m in document.get("Messages") or [])
        if state not in TASK_OK or document.get("TaskStatus") in ("Critical",):
            raise BmcError(f"{self.base_url}: firmware update task {state}: {messages}"
                           .rstrip(": "))
        return f"task {document.get('Id', '-')} {state}" + (f": {messages}" if messages else "")
