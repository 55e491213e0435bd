"""The fake driver: BMCs kept in `<state>/power/fake-bmcs.json`, for tests and dry runs.

State survives between CLI invocations. Two addresses simulate trouble: `unreachable`
fails at once, `hang` never answers (so fan-out deadlines can be tested without a network).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from provisiond.errors import BmcUnreachable, InvalidInput
from provisiond.power.base import Driver, FirmwareComponent
from provisiond.state.layout import Layout
from provisiond.state.local import edited, read_json
from provisiond.state.models import FakeBmc, FakeBmcs, FakeBoot
from provisiond.states import BootDevice, PowerAction, PowerState

# PowerAction -> the state the fake system is in afterwards.
ACTION_RESULT = {
    PowerAction.ON: PowerState.ON,
    PowerAction.OFF: PowerState.OFF,
    PowerAction.SOFT_OFF: PowerState.OFF,
    PowerAction.CYCLE: PowerState.ON,
    PowerAction.RESET: PowerState.ON,
}
BOOTING_ACTIONS = {PowerAction.ON, PowerAction.CYCLE, PowerAction.RESET}
HANG_SECONDS = 600
DEFAULT_FIRMWARE = {"BIOS": "1.0.0", "BMC": "1.00"}


class FakeDriver(Driver):
    """An in-file BMC: power state, next boot device, firmware versions, a boot count."""

    def validate(self) -> None:
        if self.settings.address in ("", None):
            raise InvalidInput(f"node {self.settings.node}: bmc.address is not set")

    def get_power_state(self) -> PowerState:
        return PowerState(self._read().power)

    def set_power(self, action: PowerAction) -> None:
        with self._edit() as system:
            was_on = system.power == PowerState.ON.value
            if action is PowerAction.ON and was_on:
                return
            if action is PowerAction.RESET and not was_on:
                return
            system.power = ACTION_RESULT[action].value
            if action in BOOTING_ACTIONS:
                self._boot(system)

    def set_boot_device(self, device: BootDevice, persistent: bool, uefi: bool | None) -> None:
        with self._edit() as system:
            system.boot = FakeBoot(device=device, persistent=persistent,
                                   uefi=system.boot.uefi if uefi is None else uefi)

    def list_firmware(self) -> list[FirmwareComponent]:
        firmware = self._read().firmware
        return [FirmwareComponent(name, version, True) for name, version in firmware.items()]

    def update_firmware(self, image_url: str) -> str:
        with self._edit() as system:
            major, minor, *rest = system.firmware["BIOS"].split(".")
            version = ".".join([major, str(int(minor) + 1), *rest])
            system.firmware["BIOS"] = version
            system.last_image = image_url
        return f"BIOS updated to {version}"

    def _boot(self, system: FakeBmc) -> None:
        """Record a boot: which device it used; a one-time override is then spent."""
        system.boots.append(system.boot.device.value)
        if not system.boot.persistent:
            system.boot.device = BootDevice.DISK

    def _read(self) -> FakeBmc:
        self._contact()
        found = read_fake_bmcs(self._path).get(self.settings.node)
        return FakeBmc.model_validate(found or new_system())

    def _edit(self):
        self._contact()
        return _edit_system(self._path, self.settings.node)

    def _contact(self) -> None:
        if self.settings.address == "unreachable":
            raise BmcUnreachable(f"fake BMC of {self.settings.node} is unreachable")
        if self.settings.address == "hang":
            time.sleep(HANG_SECONDS)

    @property
    def _path(self) -> Path:
        return Layout(Path(self.settings.state_dir)).fake_bmcs


def new_system() -> dict:
    return {"power": PowerState.OFF.value, "boots": [], "firmware": dict(DEFAULT_FIRMWARE),
            "boot": {"device": BootDevice.DISK.value, "persistent": True, "uefi": None}}


def read_fake_bmcs(path: Path) -> dict:
    """Every fake system by node name (tests read it to see what the driver did)."""
    return read_json(path)


@contextlib.contextmanager
def _edit_system(path: Path, node: str) -> Iterator[FakeBmc]:
    """Change one fake system under the file's lock; written back on a clean exit."""
    with edited(path, **FakeBmcs.FORMAT) as data:
        system = FakeBmc.model_validate(data.get(node) or new_system())
        yield system
        data[node] = system.document()
