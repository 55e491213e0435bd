"""The BMC driver interface, split by capability (power, boot, firmware), and its settings.

A driver is built from a node's resolved `BmcSettings`; `validate()` checks them without
contacting the BMC. Drivers translate library errors into provisiond errors at their edge.
"""

from __future__ import annotations

import abc
import functools
import time
from dataclasses import dataclass, field

from provisiond.errors import BmcError, BmcUnreachable, InvalidInput
from provisiond.states import BmcDriver, BootDevice, PowerAction, PowerState

BUSY_RETRY_DELAY = 1.0


@dataclass(frozen=True)
class BmcSettings:
    """A node's BMC settings after the merge, with the password resolved (never printed)."""

    node: str
    driver: BmcDriver
    address: str | None = None
    port: int | None = None
    system_id: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    verify_tls: bool = True
    ca_file: str | None = None
    scheme: str = "https"
    cipher_suite: int | None = None
    timeout: float = 20.0
    boot_once: bool = True
    state_dir: str = ""

    def require(self, *names: str) -> None:
        """Raise InvalidInput naming the first of `names` that is not set."""
        for name in names:
            if getattr(self, name) in (None, ""):
                what = "password (secret bmc_password or bmc.password_file)" \
                    if name == "password" else f"bmc.{name}"
                raise InvalidInput(f"node {self.node}: {what} is not set")


@dataclass(frozen=True)
class FirmwareComponent:
    """One line of a firmware inventory."""

    name: str
    version: str
    updateable: bool | None = None

    def to_data(self) -> dict:
        return {"name": self.name, "version": self.version, "updateable": self.updateable}


class cached_per_driver:  # noqa: N801 - a decorator, named like functools.cached_property
    """functools.cached_property without its lock, for a driver's session or connection.

    On Python 3.11 that lock is one per property for every instance (3.12 removed it), so
    each driver's login waited for every other driver's: a fan-out met its BMCs one after
    another, and one that did not answer held up the rest until it timed out. A driver
    serves one thread, so it needs no lock of its own.
    """

    def __init__(self, open_once):
        self.open_once = open_once
        self.__doc__ = open_once.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, driver, owner=None):
        if driver is None:
            return self
        value = self.open_once(driver)
        driver.__dict__[self.name] = value  # found there first from now on: opened once
        return value


class PowerInterface(abc.ABC):
    @abc.abstractmethod
    def get_power_state(self) -> PowerState:
        """The system's power state as the BMC reports it."""

    @abc.abstractmethod
    def set_power(self, action: PowerAction) -> None:
        """Ask the BMC for `action`; returns once the BMC accepted it."""


class BootInterface(abc.ABC):
    @abc.abstractmethod
    def set_boot_device(self, device: BootDevice, persistent: bool, uefi: bool | None) -> None:
        """Boot from `device` next time (or always); uefi None keeps the BMC's mode."""


class FirmwareInterface(abc.ABC):
    @abc.abstractmethod
    def list_firmware(self) -> list[FirmwareComponent]:
        """The firmware components and versions the BMC reports."""

    @abc.abstractmethod
    def update_firmware(self, image_url: str) -> str:
        """Have the BMC fetch and apply `image_url`; wait for the end; a one-line summary."""


class Driver(PowerInterface, BootInterface, FirmwareInterface):
    """Every capability of one BMC; a driver lacking one raises UnsupportedOperation."""

    def __init__(self, settings: BmcSettings):
        self.settings = settings
        self.deadline = time.monotonic() + settings.timeout

    def remaining(self) -> float:
        """Seconds left before this driver's deadline (at least a tenth of a second)."""
        return max(0.1, self.deadline - time.monotonic())

    @abc.abstractmethod
    def validate(self) -> None:
        """Check the settings without contacting the BMC; raise InvalidInput if unusable."""

    def close(self) -> None:
        """Release sessions or sockets; the default has none."""


class BmcBusy(BmcError):
    """The BMC asked to be asked again later (HTTP 503, IPMI completion code 0xC0)."""


def retry_busy(call, deadline: float):
    """Run `call()` again while the BMC says it is busy, until `deadline` (monotonic)."""
    while True:
        try:
            return call()
        except BmcBusy as exc:
            if time.monotonic() + BUSY_RETRY_DELAY >= deadline:
                raise BmcUnreachable(f"BMC stayed busy: {exc}") from None
            time.sleep(BUSY_RETRY_DELAY)


def bmc_call(library_errors: tuple[type[BaseException], ...], translate):
    """Decorate a driver method: retried while the BMC is busy, until the driver's deadline;
    `library_errors` become provisiond errors through `translate(driver, exc)`."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            def attempt():
                try:
                    return method(self, *args, **kwargs)
                except library_errors as exc:
                    raise translate(self, exc) from None

            return retry_busy(attempt, self.deadline)

        return wrapper

    return decorate
