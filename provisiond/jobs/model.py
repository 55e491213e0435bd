"""The documents of asynchronous jobs: what each kind takes (its params) and the job record.

Declared once here; the store writes them, the runner fills in results, the API returns them
and its OpenAPI document is generated from them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from provisiond.config import bounded
from provisiond.errors import InvalidInput
from provisiond.inventory.store import describe_validation_error
from provisiond.power.firmware_url import has_credentials, without_credentials
from provisiond.power.operations import (FIRMWARE_UPDATE_TIMEOUT, TIMEOUT_RANGE,
                                         firmware_update)
from provisiond.states import BootDevice, JobKind, JobState, PowerAction

Seconds = Annotated[float, bounded(*TIMEOUT_RANGE)]
POWER_STATUS = "status"
POWER_VERBS = (*(action.value for action in PowerAction), POWER_STATUS)
URL_PARAMS = ("image",)
"""Params holding a URL, which may hold a user and password, or a query that is a credential
(a pre-signed URL's signature): firmware-update's image."""


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PowerParams(_Params):
    action: Literal[POWER_VERBS]  # type: ignore[valid-type]
    """A power action, or `status` to read each node's power state."""
    timeout: Seconds | None = None
    """Per-BMC deadline in seconds (default: the node's bmc.timeout, else power.timeout)."""


class BootdevParams(_Params):
    device: BootDevice
    persistent: bool = False
    """Keep this device for every boot (default: the next boot only)."""
    uefi: bool | None = None
    """true: UEFI, false: legacy BIOS, null: keep the BMC's mode."""
    timeout: Seconds | None = None


class FirmwareUpdateParams(_Params):
    image: str = Field(max_length=2048)
    """http(s) URL of the firmware image, reachable by the BMCs. A user and password in it
    (https://USER:PASSWORD@host/...) and its query (a pre-signed URL's signature) reach the
    BMCs only: the job, its results and errors show the URL without them (the query as
    `?***`)."""
    timeout: Seconds = FIRMWARE_UPDATE_TIMEOUT

    @field_validator("image")
    @classmethod
    def _url(cls, value: str) -> str:
        try:
            firmware_update(value)  # the CLI's check of the URL
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value


class ReprovisionParams(_Params):
    timeout: Seconds | None = None
    """How long to wait for every node to report ready (default 600 s); with `wait: false`,
    the per-BMC deadline (default: the node's bmc.timeout, else power.timeout)."""
    wait: bool = True
    """false: end once each BMC took the PXE boot, without waiting for ready (Slurm's
    resume, which waits for the node itself)."""


class ImageBuildParams(_Params):
    no_cache: bool = False
    """Rebuild every layer (e.g. to take newer packages from the mirror)."""


class OverlayBuildParams(_Params):
    all: bool = False
    """Build every node (and drop shared builds no node uses any more)."""


PARAMS: dict[JobKind, type[_Params]] = {
    JobKind.POWER: PowerParams,
    JobKind.BOOTDEV: BootdevParams,
    JobKind.FIRMWARE_UPDATE: FirmwareUpdateParams,
    JobKind.REPROVISION: ReprovisionParams,
    JobKind.IMAGE_BUILD: ImageBuildParams,
    JobKind.OVERLAY_BUILD: OverlayBuildParams,
}


def parse_params(kind: JobKind, params: dict) -> _Params:
    """`params` checked against the kind's model; the first problem is InvalidInput."""
    try:
        return PARAMS[kind].model_validate(params)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(exc)) from None


def split_secret(params: dict) -> tuple[dict, dict]:
    """The params as a job's record keeps them and everyone may read them (URLs without
    their user and password, their query hidden), and the params taken out of them whole
    (kept apart, 0600)."""
    shown, secret = dict(params), {}
    for key in URL_PARAMS:
        value = params.get(key)
        if isinstance(value, str) and has_credentials(value):
            shown[key], secret[key] = without_credentials(value), value
    return shown, secret


class JobResult(BaseModel):
    """What happened to one target (a node, or the image an image build makes)."""

    name: str
    result: Literal["ok", "error"]
    detail: str
    seconds: float = 0.0


class Job(BaseModel):
    """One job's record, as stored under `<state>/jobs/<id>.json` and returned by the API."""

    id: int
    kind: JobKind
    target: str
    """The targets folded into one range (n[01-04]), or the image's name."""
    names: list[str]
    params: dict
    secret_params: list[str] = []
    """Params held without their credentials here, and whole in `<state>/jobs/<id>.secret`
    (0600) while the job is pending or running: the runner reads them from there."""
    actor: str
    """Who asked: `token:NAME` through the API, `cli:USER` from the command line."""
    state: JobState
    created: float
    started: float | None = None
    finished: float | None = None
    message: str | None = None
    """Why the job failed, in one line; null while it runs or when every target is ok."""
    results: list[JobResult] = []
    """One per target as each ends (in target order once the job ends)."""
    runner_pid: int | None = None
    runner_start: int | None = None
    """The runner's process start time (clock ticks since boot): a reused pid is not it."""

    @property
    def active(self) -> bool:
        return self.state in (JobState.PENDING, JobState.RUNNING)
