"""The server's settings: one value, loaded from `<state-dir>/provisiond.yaml` and passed in.

Nothing in provisiond reads settings from a module global; every function that needs them
takes a `Config`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from provisiond.documents import load_yaml_mapping
from provisiond.errors import InvalidConfig

DEFAULT_STATE_DIR = "/var/lib/provisiond"
CONFIG_NAME = "provisiond.yaml"
REPO_ROOT = Path(__file__).resolve().parent.parent


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    address: str = "127.0.0.1"
    """The address nodes use to reach this server (put in iPXE scripts and DHCP answers)."""
    domain: str = "cluster"
    ssh_authorized_keys: list[str] = []

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        ipaddress.ip_address(value)
        return value


class HttpSettings(_Section):
    enabled: bool = True
    bind: str = "0.0.0.0"
    port: int = 9873
    workers: int = 2
    threads: int = 16
    """gunicorn gthread threads per worker."""


class DhcpSettings(_Section):
    enabled: bool = False
    interface: str | None = None
    bind: str = "0.0.0.0"
    port: int = 67
    proxy: bool = False
    lease_seconds: int = 3600
    discovery: bool = False
    dns_servers: list[str] = []


class TftpSettings(_Section):
    enabled: bool = False
    bind: str = "0.0.0.0"
    port: int = 69
    root: str = "/usr/lib/ipxe"


class DnsSettings(_Section):
    enabled: bool = False
    bind: str = "0.0.0.0"
    port: int = 53
    upstream: str | None = None
    ttl: int = 300


class BuildSettings(_Section):
    compression: str = "zstd"
    workers: int = 0
    """Parallel overlay build workers; 0 means one per core."""


class PowerSettings(_Section):
    concurrency: int = 32
    timeout: float = 20.0


class Config(_Section):
    """All of provisiond's settings plus where its state lives."""

    state_dir: Path = Path(DEFAULT_STATE_DIR)
    server: ServerSettings = ServerSettings()
    http: HttpSettings = HttpSettings()
    dhcp: DhcpSettings = DhcpSettings()
    tftp: TftpSettings = TftpSettings()
    dns: DnsSettings = DnsSettings()
    build: BuildSettings = BuildSettings()
    power: PowerSettings = PowerSettings()
    overlay_dirs: list[Path] = []
    """Extra overlay search dirs, searched before the state dir's and the shipped ones."""
    image_dirs: list[Path] = []
    """Extra recipe dirs, searched before the state dir's and the shipped ones."""

    @property
    def server_url(self) -> str:
        """The base URL nodes use to reach this server's HTTP endpoints."""
        host = self.server.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.http.port}"

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yaml"

    @property
    def secrets_path(self) -> Path:
        return self.state_dir / "secrets.yaml"

    @property
    def blob_dir(self) -> Path:
        return self.state_dir / "blobs" / "sha256"

    @property
    def images_dir(self) -> Path:
        return self.state_dir / "images"

    @property
    def status_dir(self) -> Path:
        return self.state_dir / "status"

    @property
    def overlay_build_dir(self) -> Path:
        return self.state_dir / "overlay-builds"

    @property
    def overlay_search_path(self) -> list[Path]:
        """Site overlays shadow shipped ones: the first dir holding a name wins."""
        return [*self.overlay_dirs, self.state_dir / "overlays", REPO_ROOT / "overlays"]

    @property
    def recipe_search_path(self) -> list[Path]:
        return [*self.image_dirs, self.state_dir / "recipes", REPO_ROOT / "images"]


def resolve_state_dir(flag: str | None) -> Path:
    """The state dir from the flag, else $PROVISIOND_STATE_DIR, else the default."""
    return Path(flag or os.environ.get("PROVISIOND_STATE_DIR") or DEFAULT_STATE_DIR)


def load_config(state_dir: Path) -> Config:
    """Read `<state_dir>/provisiond.yaml`; a missing file means all defaults."""
    path = state_dir / CONFIG_NAME
    data: dict = {}
    if path.exists():
        data = load_yaml_mapping(path.read_text(), str(path), InvalidConfig,
                                 "a mapping at the top level")
    data.pop("state_dir", None)
    try:
        return Config(state_dir=state_dir, **data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidConfig(f"{path}: {where}: {err['msg']}") from None



CONFIG_TEMPLATE = """\
# provisiond settings. Every key is optional; the values shown are the defaults
# unless noted. Changes take effect when `provisiond serve` restarts.

server:
  # The address nodes use to reach this server: it goes into DHCP answers and
  # iPXE scripts. Set it to the boot network address of this host.
  address: 127.0.0.1
  # DNS domain of the nodes (n001.cluster).
  domain: cluster
  # Public keys put into every node's root authorized_keys (ssh overlay).
  ssh_authorized_keys: []

http:
  enabled: true
  bind: 0.0.0.0
  port: 9873
  workers: 2
  threads: 16           # gunicorn gthread threads per worker

dhcp:
  # Answers known MACs with their reserved address and a boot file.
  enabled: false
  interface: null        # e.g. br0; null listens on all
  bind: 0.0.0.0
  port: 67
  proxy: false           # true: boot information only, beside another DHCP server
  lease_seconds: 3600
  discovery: false       # record unknown MACs as discovery events
  dns_servers: []        # default: server.address when dns is enabled

tftp:
  enabled: false
  bind: 0.0.0.0
  port: 69
  root: /usr/lib/ipxe    # iPXE binaries from Debian's ipxe package

dns:
  enabled: false
  bind: 0.0.0.0
  port: 53
  upstream: null         # forward other names there; null answers NXDOMAIN
  ttl: 300

build:
  compression: zstd      # or gzip
  workers: 0             # overlay build workers; 0 = one per core

power:
  concurrency: 32        # BMCs contacted at once
  timeout: 20.0          # seconds per BMC
"""


def write_default_config(state_dir: Path) -> Path:
    """Create the state dir with a commented provisiond.yaml; an existing file is kept."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / CONFIG_NAME
    if not path.exists():
        path.write_text(CONFIG_TEMPLATE)
    return path
