"""The shared vocabulary: enums used by the CLI, the API, the drivers and the servers."""

from enum import Enum


class NodePhase(str, Enum):
    """Where a node is in its boot, in the order a good boot passes them."""

    DHCP = "dhcp"
    IPXE = "ipxe"
    KERNEL = "kernel"
    BOOTED = "booted"
    RUNTIME = "runtime"
    CONFIGURED = "configured"
    READY = "ready"
    FAILED = "failed"


class PowerState(str, Enum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"


class PowerAction(str, Enum):
    ON = "on"
    OFF = "off"
    SOFT_OFF = "soft-off"
    CYCLE = "cycle"
    RESET = "reset"


class BootDevice(str, Enum):
    PXE = "pxe"
    DISK = "disk"


class BmcDriver(str, Enum):
    REDFISH = "redfish"
    IPMI = "ipmi"
    FAKE = "fake"


class Compression(str, Enum):
    ZSTD = "zstd"
    GZIP = "gzip"


class JobKind(str, Enum):
    """What an asynchronous job does (provisiond.jobs)."""

    POWER = "power"
    BOOTDEV = "bootdev"
    FIRMWARE_UPDATE = "firmware-update"
    REPROVISION = "reprovision"
    IMAGE_BUILD = "image-build"
    OVERLAY_BUILD = "overlay-build"


class JobState(str, Enum):
    """A job waits for its runner, runs, then ends finished (every target ok) or failed."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
