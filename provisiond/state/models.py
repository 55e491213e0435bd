"""The documents provisiond's parts exchange, declared once (sushy's "declare the shape once").

Each model reads every document already written (older builds, a bench's trimmed manifests)
and writes it back unchanged: unknown fields are kept (`extra="allow"`, so a newer writer's
fields survive an older reader), and `document()` dumps only the fields the document had
or the code set (no defaults added), in the writer's field order. Numbers stay the type they
were (an int is not rewritten as a float). The layout (provisiond.state.layout) names where
each lives.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from provisiond.errors import InvalidInput, ProvisiondError
from provisiond.states import BootDevice, NodePhase

Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
Number = int | float
"""Seconds, epoch times: kept int or float as written."""


class Written:
    """How a document's file is written (as the writers did before the models, so files
    compared or hashed stay byte for byte the same): json.dumps options, final newline."""

    FORMAT: ClassVar[dict[str, Any]] = {}
    NEWLINE: ClassVar[bool] = False

    def document(self) -> Any:
        """The JSON value to write: the fields set, in order, extra ones after."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)

    def text(self) -> str:
        """The file's text."""
        return json.dumps(self.document(), **self.FORMAT) + ("\n" if self.NEWLINE else "")


class Document(Written, BaseModel):
    """A JSON object written by provisiond."""

    model_config = ConfigDict(extra="allow")


class DamagedDocument(ProvisiondError):
    """A document in the state directory is not what its model says (edited by hand, cut
    short by a full disk...)."""

    code = "damaged_document"


def parse(model: type[BaseModel], data: Any, where: object,
          error: type[ProvisiondError] = InvalidInput) -> Any:
    """`data` (a JSON value, or JSON text as bytes or str) as `model`; else `error`
    naming `where` and the first problem, in one line."""
    try:
        if isinstance(data, (bytes, str)):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise error(f"{where}: {field + ': ' if field else ''}{first['msg']}") from None


# --- images/<name>/manifest.json and cache/layers/<key>.json ---------------------------------

class Kernel(Document):
    digest: Digest
    size: int = 0
    version: str = ""


class ManifestLayer(Document):
    """A layer as the manifest lists it (the boot reads digest; the rest is for people)."""

    digest: Digest
    size: int = 0
    key: str = ""
    kind: str = ""
    """the recipe entry's kind (busybox, debootstrap, packages, tar...)"""
    compression: str = ""
    description: str = ""


class RecipeSource(Document):
    path: str
    sha256: str = ""


class MountedLayer(Document):
    digest: Digest
    size: int = 0
    file: str = ""


class BootKit(Document):
    digest: Digest
    size: int = 0
    modules: list[str] = []
    format: str = ""


class Mounted(Document):
    """The manifest's `mounted` part (provisiond.images.squash): a mounted boot's layer
    blobs and boot kit, or why nodes of the image boot unpacked."""

    boot: str = "unpacked"
    format: str = ""
    layers: list[MountedLayer] = []
    kit: BootKit | None = None
    unavailable: str | None = None


class ImageManifest(Document):
    """The current build of an image (docs/contracts.md, "Image manifest")."""

    FORMAT: ClassVar[dict[str, Any]] = {"indent": 2}
    NEWLINE: ClassVar[bool] = True

    name: str
    kernel: Kernel
    layers: list[ManifestLayer]
    kernel_args: list[str] = []
    init: str = "/sbin/init"
    recipe: RecipeSource | None = None
    built_at: str = ""
    build_seconds: Number = 0.0
    total_size: int = 0
    layer_build_seconds: list[Number] = []
    mounted: Mounted | None = None
    generation: str = ""
    """made at the image's first build (the first after a delete too, and `image import
    --force`), kept by every rebuild: which image an `image shell` session opened
    (provisiond.images.shell); "", kept by rebuilds too, for one built before generations"""


class LayerRecord(Document):
    """A built layer in the layer cache: what the manifest lists, plus what the builder
    needs to reuse it (entries packed, whether it deletes, its whiteout count, the
    directories of lower layers it replaces by a file or link)."""

    FORMAT: ClassVar[dict[str, Any]] = {"indent": 1}
    NEWLINE: ClassVar[bool] = True

    key: str
    digest: Digest
    size: int
    kind: str
    compression: str
    description: str = ""
    entries: int = 0
    deletes: bool = False
    whiteouts: int = 0
    replaced: list[str] = []
    """paths (relative) where its file or link replaces a lower layer's directory
    (provisiond.images.layers.replaced_dirs)"""
    build_seconds: Number = 0.0
    mounted: dict[str, Any] | None = None
    """its mounted form (provisiond.images.squash)"""


class ShellLayer(Document):
    """One layer `image shell` added (images/<name>/shell.json holds a list of them)."""

    path: str
    """`shell/<sha256>.tar`, relative to the image's folder"""
    description: str = ""


class ShellLayers(Written, RootModel[list[ShellLayer]]):
    """images/<name>/shell.json."""

    FORMAT: ClassVar[dict[str, Any]] = {"indent": 1}
    NEWLINE: ClassVar[bool] = True


# --- status/<node>.json ----------------------------------------------------------------------

class TokenRefusal(Document):
    time: Number
    reason: str = ""
    address: str = ""


class NodeStatus(Document):
    """A node's boot: the phases reached (epoch seconds), the newest, and the last refused
    provisioning token (provisiond.status)."""

    FORMAT: ClassVar[dict[str, Any]] = {"sort_keys": True}

    node: str
    phase: NodePhase | None = None
    phases: dict[NodePhase, Number] = {}
    boot_started: Number = 0
    updated: Number = 0
    detail: str = ""
    memory: dict[str, int] | None = None
    """the agent's /proc/meminfo figures (mem_total_kib, mem_available_kib)"""
    token_refused: TokenRefusal | None = None

    @classmethod
    def of(cls, node: str, data: dict | None) -> "NodeStatus":
        """The status `data` holds (as provisiond.status reads it); a node without one, or
        with a damaged one (replaced whole by its next boot), has no phase."""
        try:
            return cls.model_validate({"node": node, **(data or {})})
        except ValidationError:
            return cls(node=node)

    def reached(self, phase: NodePhase, since: float) -> bool:
        """Whether the node's newest phase is `phase`, in a boot started at `since` or
        later."""
        return self.phase is phase and self.boot_started >= since


# --- the DHCP server ---------------------------------------------------------------------------

class Lease(Document):
    ip: str
    expires: int
    """epoch seconds"""


class Leases(Written, RootModel[dict[str, Lease]]):
    """dhcp-leases.json: the unexpired leases by MAC (a discovery pool lease is one of a
    `discovery.pool` address; serve reads them back at start)."""

    FORMAT: ClassVar[dict[str, Any]] = {"sort_keys": True}


class Sighting(Document):
    """One line of discovery.jsonl: an unknown MAC asked for DHCP (with what it said)."""

    FORMAT: ClassVar[dict[str, Any]] = {"sort_keys": True}

    time: Number
    mac: str


# --- power ---------------------------------------------------------------------------------

class PendingBootdev(Document):
    """A boot-device reset owed to a BMC without one-time boot, since `since` (epoch)."""

    device: BootDevice = BootDevice.DISK
    since: Number


class PendingBootdevs(Written, RootModel[dict[str, PendingBootdev]]):
    """power/pending-bootdev.json, by node."""

    FORMAT: ClassVar[dict[str, Any]] = {"indent": 1, "sort_keys": True}


class FakeBoot(Document):
    device: BootDevice
    persistent: bool
    uefi: bool | None = None


class FakeBmc(Document):
    """One system of the fake power driver (provisiond.power.fake)."""

    power: str
    boots: list[str] = []
    """the boot device of every power-on, oldest first"""
    firmware: dict[str, str] = {}
    boot: FakeBoot


class FakeBmcs(Written, RootModel[dict[str, FakeBmc]]):
    """power/fake-bmcs.json, by node."""

    FORMAT: ClassVar[dict[str, Any]] = {"indent": 1, "sort_keys": True}
