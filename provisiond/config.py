"""The server's settings: one value, loaded from `<state-dir>/provisiond.yaml` and passed in.

Nothing in provisiond reads settings from a module global; every function that needs them
takes a `Config`. Every value is bounded here, when the settings load, so a bad one is one
line before anything starts (never a traceback or a dead service later);
`check_serving` adds what depends on the machine (tftp.root exists) for `provisiond serve`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      field_validator, model_validator)

from provisiond.documents import Schema, load_yaml_mapping
from provisiond.errors import InvalidConfig
from provisiond.states import Compression

DEFAULT_STATE_DIR = "/var/lib/provisiond"
CONFIG_NAME = "provisiond.yaml"
CACHE_NAME = "cache"  # <state>/cache: downloads and image layer trees (root file systems)
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
"""The overlays, image recipes and profiles installed with the package (package data)."""
# A DNS label, lowercase: a domain's labels here, and node, profile and image names
# (provisiond.inventory.values). Use fullmatch: `$` also matches before a final newline.
LABEL_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
INTERFACE_RE = re.compile(r"^[^\s/:]{1,15}$")  # IFNAMSIZ - 1 bytes, no '/', ':', blanks
# Control and format characters (C0, DEL, C1, soft hyphen, zero-width and bidi controls,
# line/paragraph separators, BOM): a value holding one can end a line of a script, a kernel
# command line or a template, or repaint a terminal. Settings and inventory share the rule.
CONTROLS = (r"\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e"
            r"\u2060-\u206f\ufeff\ufff9-\ufffb")
CONTROL_RE = re.compile(f"[{CONTROLS}]")


def bounded(low: float, high: float):
    """A validator keeping a number within [low, high] (NaN is outside every range)."""
    def check(value):
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low}-{high}")
        return value
    return AfterValidator(check)


def ip_literal(value: str) -> str:
    """An IP address without a scope id, normalised; `[::]` is taken as `::`."""
    text = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"not an IP address: {value!r}") from None
    if getattr(address, "scope_id", None):
        raise ValueError(f"{value!r}: a scope id (%...) is not allowed; use the interface "
                         "setting") from None
    return str(address)


def ipv4_literal(value: str) -> str:
    address = ip_literal(value)
    if ":" in address:
        raise ValueError(f"{value!r}: DHCP (v4) needs an IPv4 address")
    return address


def unicast_address(value: str) -> str:
    """An address nodes can reach: not 0.0.0.0/::, not multicast or broadcast, not an
    IPv4-mapped IPv6 form (the DNS zone cannot publish one: serve died at start)."""
    address = ipaddress.ip_address(ip_literal(value))
    if address.is_unspecified or address.is_multicast or str(address) == "255.255.255.255":
        raise ValueError(f"{value!r} is not an address nodes can reach")
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped:
        raise ValueError(f"{value!r} is an IPv4-mapped address; write {mapped}")
    return str(address)


def domain_name(value: str) -> str:
    """A DNS domain: dot-separated labels of 1-63 letters, digits, '-'; 253 chars at most."""
    name = value.lower().rstrip(".")
    if not name or len(name) > 253:
        raise ValueError(f"{value!r}: a domain has 1-253 characters")
    for label in name.split("."):
        if not LABEL_RE.fullmatch(label):
            raise ValueError(f"{value!r}: label {label!r} is not 1-63 letters, digits or '-' "
                             "(not starting or ending with '-')")
    return name


def no_control_chars(value: str) -> str:
    if not value.strip() or CONTROL_RE.search(value):
        raise ValueError("an empty value or a control or format character (newline, tab, "
                         "bidi...)")
    return value


def parse_upstream(text: str, default_port: int | None = 53) -> tuple[str, int]:
    """(host, port) of `dns.upstream`: host, host:port, an IPv6 address, [IPv6]:port
    (`default_port` None: the port must be given)."""
    port = "" if default_port is None else str(default_port)
    host = text
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or rest[:1] not in ("", ":"):
            raise ValueError(f"not an address: {text!r}")
        port = rest[1:] or port
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not host:port (port 1-65535): {text!r}")
    return upstream_host(host), int(port)


STORE_ROOT_RE = re.compile(r"(/[A-Za-z0-9._-]+)+/?")
DEFAULT_STORE_ROOT = "/provisiond/"
STORE_SCHEMES = {"etcd://": False, "etcds://": True}
"""The etcd store URL schemes and whether each speaks TLS to the members."""


class StoreUrl(NamedTuple):
    endpoints: list[tuple[str, int]]
    root: str
    tls: bool


def parse_store_url(url: str) -> StoreUrl:
    """(endpoints, key root, TLS) of an `etcd[s]://HOST:PORT[,HOST:PORT...][/ROOT]` store
    URL; the root defaults to /provisiond/ and always ends with '/'."""
    scheme = next((scheme for scheme in STORE_SCHEMES if url.startswith(scheme)), None)
    if scheme is None:
        raise ValueError(f"{url!r}: etcd://HOST:PORT[,HOST:PORT...] or etcds://... with TLS "
                         "(null: the state dir)")
    hosts, slash, root = url.removeprefix(scheme).partition("/")
    root = f"/{root}" if slash and root else DEFAULT_STORE_ROOT
    if not STORE_ROOT_RE.fullmatch(root):
        raise ValueError(f"{url!r}: the key root {root!r} is not /NAME[/NAME...] of letters, "
                         "digits, '.', '_', '-'")
    try:
        endpoints = [parse_upstream(host, None) for host in hosts.split(",")]
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc} (etcd://HOST:PORT[,HOST:PORT...])") from None
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"{url!r}: an endpoint is named twice")
    return StoreUrl(endpoints, root.removesuffix("/") + "/", STORE_SCHEMES[scheme])


def store_url(value: str | None) -> str | None:
    if value is not None:
        parse_store_url(value)
    return value


def upstream_host(host: str) -> str:
    """An IP address without a scope id, or a host name of DNS labels ('a b', 10.0.0.300 and
    fe80::1%lo loaded, then failed when serve started, naming no setting)."""
    if ":" in host or "%" in host or host.replace(".", "").isdigit():
        return ip_literal(host)
    return domain_name(host)


def url_host(address: str) -> str:
    """An address as the host part of a URL or a bind: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


Port = Annotated[int, bounded(1, 65535)]
BindAddress = Annotated[str, AfterValidator(ip_literal)]
Count = Annotated[int, bounded(1, 1024)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    address: Annotated[str, AfterValidator(unicast_address)] = "127.0.0.1"
    """The address nodes use to reach this server (put in iPXE scripts and DHCP answers)."""
    domain: Annotated[str, AfterValidator(domain_name)] = "cluster"
    ssh_authorized_keys: list[Annotated[str, AfterValidator(no_control_chars)]] = []


class HttpSettings(_Section):
    enabled: bool = True
    bind: BindAddress = "0.0.0.0"
    port: Port = 9873
    workers: Annotated[int, bounded(1, 64)] = 2
    connections: Annotated[int, bounded(10, 100_000)] = 1000
    """Open connections per worker (each a greenlet); beyond it, new ones wait in the backlog."""
    event_streams: Annotated[int, bounded(1, 10_000)] = 100
    """`GET /api/v1/events` streams per worker (each holds a connection); beyond it, 503."""
    client_timeout: Annotated[float, bounded(1, 3600)] = 30.0
    """Seconds one receive from or send to a client may wait (a TLS handshake's too): a
    client silent or not reading for longer is disconnected, freeing its connection."""


class ApiSettings(_Section):
    """The API's own listener (a management network), apart from the boot network's."""

    bind: BindAddress | None = None
    """None: /api/v1 is served by the boot listener (http.bind). An address: by a listener
    of its own there, with TLS when tls_cert and tls_key are set; the boot listener then
    serves only what nodes fetch (boot scripts, blobs, overlays, their status reports)."""
    port: Port = 9874
    workers: Annotated[int, bounded(1, 64)] = 1
    tls_cert: str | None = None
    tls_key: str | None = None

    @field_validator("tls_cert", "tls_key")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r}: an absolute path")
        return value

    @model_validator(mode="after")
    def _tls(self) -> "ApiSettings":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        if self.tls_cert and self.bind is None:
            raise ValueError("TLS needs the API's own listener: set api.bind (the boot "
                             "listener stays plain HTTP, which iPXE and the nodes speak)")
        return self

    @property
    def url(self) -> str | None:
        """Where the API answers, or None when it shares the boot listener."""
        if self.bind is None:
            return None
        return f"{'https' if self.tls_cert else 'http'}://{url_host(self.bind)}:{self.port}"


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"
    """text: `time LEVEL logger message`; json: one object per line, for log shippers."""


class DhcpSettings(_Section):
    enabled: bool = False
    interface: str | None = None
    bind: Annotated[str, AfterValidator(ipv4_literal)] = "0.0.0.0"
    port: Port = 67
    proxy: bool = False
    lease_seconds: Annotated[int, bounded(60, 0xFFFFFFFF)] = 3600
    """At least a minute; 4294967295 (the largest DHCP lease) means infinite."""
    discovery: bool = False
    dns_servers: list[Annotated[str, AfterValidator(ipv4_literal)]] = []

    @field_validator("interface")
    @classmethod
    def _interface(cls, value: str | None) -> str | None:
        if value is not None and not INTERFACE_RE.match(value):
            raise ValueError(f"{value!r} is not a network interface name (1-15 characters, "
                             "no '/', ':' or blanks)")
        return value

    @field_validator("dns_servers")
    @classmethod
    def _dns_count(cls, value: list[str]) -> list[str]:
        if len(value) > 16:
            raise ValueError(f"{len(value)} servers; at most 16")
        return value


class TftpSettings(_Section):
    enabled: bool = False
    bind: BindAddress = "0.0.0.0"
    port: Port = 69
    root: str = "/usr/lib/ipxe"
    sessions_per_client: Annotated[int, bounded(1, 256)] = 8
    """Transfers at once from one client address (of 256 at most in all); more are refused
    with a TFTP error."""

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r}: an absolute path")
        return value


class DnsSettings(_Section):
    enabled: bool = False
    bind: BindAddress = "0.0.0.0"
    port: Port = 53
    upstream: str | None = None
    ttl: Annotated[int, bounded(0, 2**31 - 1)] = 300
    """Seconds; RFC 2181 limits a TTL to 31 bits."""

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str | None) -> str | None:
        if value is not None:
            parse_upstream(value)
        return value

    @property
    def upstream_address(self) -> tuple[str, int] | None:
        return parse_upstream(self.upstream) if self.upstream else None

    @model_validator(mode="after")
    def _not_itself(self) -> "DnsSettings":
        """An upstream that is this server forwards each miss to itself 4096 times (the
        queries in flight), then forwards nothing for 5 s."""
        upstream = self.upstream_address
        if upstream and upstream[1] == self.port and self._listens_on(upstream[0]):
            raise ValueError(f"upstream {self.upstream} is this DNS server itself "
                             f"(bind {self.bind}, port {self.port})")
        return self

    def _listens_on(self, host: str) -> bool:
        if host == self.bind:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a host name: resolved only when serve starts
        return ipaddress.ip_address(self.bind).is_unspecified and address.is_loopback


class DiscoverySettings(_Section):
    """Unknown machines (with `dhcp.discovery` on): a pool to lease them addresses, the image
    they boot to report their hardware, and the bounds on what they may send."""

    pool: str | None = None
    """FIRST-LAST IPv4 addresses leased to unknown MACs; null: they are only recorded."""
    netmask: Annotated[str, AfterValidator(ipv4_literal)] = "255.255.255.0"
    gateway: Annotated[str, AfterValidator(ipv4_literal)] | None = None
    lease_seconds: Annotated[int, bounded(60, 86400)] = 300
    image: str = "discovery"
    """The image unknown machines boot (shipped recipe `discovery`: tiny + facts collector)."""
    max_pending: Annotated[int, bounded(1, 100_000)] = 1000
    """Machines waiting for approval at most; later ones are refused (503) until some go."""
    pending_per_address: Annotated[int, bounded(1, 100_000)] = 4
    """Pending machines one source address may enlist (spoofed MACs from one host)."""
    reports_per_minute: Annotated[int, bounded(1, 10_000)] = 12
    """Fact reports and polls from one address a minute (per HTTP worker); more: 429."""

    @field_validator("pool")
    @classmethod
    def _pool(cls, value: str | None) -> str | None:
        if value is not None:
            pool_bounds(value)
        return value

    @property
    def pool_range(self) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | None:
        return pool_bounds(self.pool) if self.pool else None

    @model_validator(mode="after")
    def _pool_network(self) -> "DiscoverySettings":
        """No lease of the network's own or broadcast address (the netmask's), nor of the
        gateway, which must be inside that network."""
        if self.pool_range is None:
            return self
        low, high = self.pool_range
        network = ipaddress.IPv4Network(f"{low}/{self.netmask}", strict=False)
        if network.prefixlen < 31:
            for address, what in ((network.network_address, "network"),
                                  (network.broadcast_address, "broadcast")):
                if low <= address <= high:
                    raise ValueError(f"pool: {self.pool} holds {address}, the {what} address "
                                     f"of {network} (discovery.netmask)")
        if self.gateway:
            gateway = ipaddress.IPv4Address(self.gateway)
            if low <= gateway <= high:
                raise ValueError(f"pool: {self.pool} holds {gateway}, the discovery.gateway")
            if gateway not in network:
                raise ValueError(f"gateway: {gateway} is outside the pool's network {network}")
        return self


def pool_bounds(text: str) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """(first, last) of a `FIRST-LAST` IPv4 range of at most 65536 addresses."""
    first, sep, last = text.partition("-")
    if not sep:
        raise ValueError(f"{text!r}: write the pool as FIRST-LAST (10.0.0.200-10.0.0.250)")
    low, high = (ipaddress.IPv4Address(ipv4_literal(a.strip())) for a in (first, last))
    if not 0 <= int(high) - int(low) < 65536:
        raise ValueError(f"{text!r}: LAST must follow FIRST, at most 65536 addresses")
    return low, high


class BuildSettings(_Section):
    compression: str = "zstd"
    workers: Annotated[int, bounded(0, 1024)] = 0
    """Parallel overlay build workers; 0 means one per core."""
    ssh_host_key_types: list[Literal["ed25519", "ecdsa", "rsa"]] = Field(
        ["ed25519", "ecdsa"], min_length=1)
    """SSH host key types made for each node (ssh overlay); RSA is slow to make."""

    @field_validator("compression")
    @classmethod
    def _compression(cls, value: str) -> str:
        names = [c.value for c in Compression]
        if value not in names:
            raise ValueError(f"{value!r} is not one of {', '.join(names)}")
        return value


class PowerSettings(_Section):
    concurrency: Annotated[int, bounded(1, 4096)] = 32
    timeout: Annotated[float, bounded(0.1, 3600)] = 20.0


class TrustSettings(_Section):
    token_minutes: Annotated[float, bounded(1, 1440)] = 10
    """How long a provisioning token (minted with each iPXE script) can be exchanged for a
    node credential: long enough for the node's kernel, layers and early boot."""
    privileged_port: bool = True
    """The exchange must come from a source port below 1024, which only root on the node
    can bind: an unprivileged user there who fetched a fresh token cannot exchange it."""


class MetricsSettings(_Section):
    require_token: bool = False
    """GET /metrics needs a reader token (Authorization: Bearer); open by default, as most
    exporters are (it holds counts, never names, addresses or secrets)."""


def peer_url(value: str) -> str:
    """A peer's HTTP base URL (http[s]://host[:port][/path]), without a trailing '/'."""
    parts = urlsplit(value)
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.query
            or parts.fragment or parts.username is not None or CONTROL_RE.search(value)
            or " " in value or not _port_ok(parts)):
        raise ValueError(f"{value!r}: an http:// or https:// base URL, e.g. "
                         "http://10.0.0.2:9873")
    return value.rstrip("/")


def _port_ok(parts) -> bool:
    """urlsplit checks a port only when asked; http.client takes 99999 modulo 65536."""
    try:
        return parts.port is None or parts.port > 0
    except ValueError:  # not a number, or beyond 65535
        return False


class PeerSettings(_Section):
    """Other boot servers and the builder, where a blob this server lacks is fetched from
    (provisiond.boot.peers; docs/scale-out.md)."""

    urls: list[Annotated[str, AfterValidator(peer_url)]] = []
    """Their HTTP base URLs, tried in order; empty: a missing blob is a 404."""
    timeout: Annotated[float, bounded(0.5, 300)] = 10.0
    """Seconds one connect or read from a peer may wait."""
    fetch_seconds: Annotated[float, bounded(1, 3600)] = 300.0
    """Seconds one blob's fetch may take over all peers (a request for it waits as long)."""


SLURM_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def slurm_name(value: str) -> str:
    """A partition, cluster or tag name as slurm.conf takes it unquoted."""
    if not SLURM_NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r}: 1-64 letters, digits, '_', '.' or '-'")
    return value


def slurm_value(value) -> str:
    """A slurm.conf value written as it is: no blank, '#' or control character."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if not text or CONTROL_RE.search(text) or any(c in text for c in " \t#"):
        raise ValueError(f"{value!r}: a slurm.conf value without blanks, '#' or control "
                         "characters")
    return text


SlurmValue = Annotated[str | int | float | bool, AfterValidator(slurm_value)]
Seconds = Annotated[int, bounded(0, 2**31 - 1)]


class SlurmSettings(_Section):
    """What `provisiond slurm config` writes into slurm.conf besides the nodes."""

    cluster_name: Annotated[str, AfterValidator(slurm_name)] = "cluster"
    controller: Annotated[str, AfterValidator(domain_name)] | None = None
    """SlurmctldHost's name: the short host name slurmctld runs on (default: this host's)."""
    controller_address: Annotated[str, AfterValidator(unicast_address)] | None = None
    """Where slurmd reaches slurmctld (default: server.address)."""
    suspend_time: Seconds | None = None
    """Idle seconds before Slurm powers a node off (SuspendTime); None: power saving off."""
    suspend_timeout: Seconds = 60
    resume_timeout: Seconds = 600
    """Seconds from ResumeProgram to slurmd registering (a PXE boot to ready, and more)."""
    resume_program: str | None = None
    """Default: <state>/slurm/resume, which `slurm config` writes (it runs `provisiond slurm
    resume` on this state dir); set it where slurmctld runs another copy."""
    suspend_program: str | None = None
    scontrol: str = "/usr/bin/scontrol"
    """What the resume program runs to set a node whose BMC failed DOWN, with the reason."""
    power_log: str | None = None
    """`--log FILE` of the resume and suspend programs; None: syslog."""
    partition_tag: Annotated[str, AfterValidator(slurm_name)] = "partition"
    """The node tag naming its partitions (comma-separated)."""
    default_partition: Annotated[str, AfterValidator(slurm_name)] = "compute"
    """The partition of nodes without that tag; Default=YES."""
    options: dict[Annotated[str, AfterValidator(slurm_name)], SlurmValue] = {}
    """More slurm.conf lines (Key: value); a key here replaces provisiond's default."""

    @field_validator("resume_program", "suspend_program", "scontrol", "power_log")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or CONTROL_RE.search(value)
                                  or " " in value):
            raise ValueError(f"{value!r}: an absolute path without blanks")
        return value

    @field_validator("options")
    @classmethod
    def _keys(cls, value: dict) -> dict:
        for key in value:
            if not SLURM_KEY_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not a slurm.conf key")
        return value


def absolute_path(value: Path | None) -> Path | None:
    if value is not None and not value.is_absolute():
        raise ValueError(f"{str(value)!r}: an absolute path")
    return value


AbsolutePath = Annotated[Path, AfterValidator(absolute_path)]


class StoreTlsSettings(_Section):
    """TLS to the members of an `etcds://` store (docs/store.md)."""

    ca_file: AbsolutePath | None = None
    """The CA certificates (PEM) the members' certificates are checked against; None: the
    system's."""
    cert_file: AbsolutePath | None = None
    """The client certificate (PEM) for members run with --client-cert-auth."""
    key_file: AbsolutePath | None = None
    """Its key (PEM, not encrypted)."""

    @model_validator(mode="after")
    def _pair(self) -> "StoreTlsSettings":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (the client certificate "
                             "and its key)")
        return self


class StoreAuthSettings(_Section):
    """The etcd user a store's requests are made as (etcd `auth enable`; docs/store.md)."""

    user: Annotated[str, Field(min_length=1, max_length=256), AfterValidator(no_control_chars)]
    password_file: AbsolutePath
    """The file holding the password (one line; readable by its owner only, mode 0600)."""


class Config(_Section):
    """All of provisiond's settings plus where its state lives."""

    state_dir: Path = Path(DEFAULT_STATE_DIR)
    store: Annotated[str | None, AfterValidator(store_url)] = None
    """Where the shared documents live: None, files in state_dir; `etcd://...`, an etcd
    cluster several servers share, `etcds://...` the same over TLS (provisiond.state.open)."""
    store_tls: StoreTlsSettings | None = None
    store_auth: StoreAuthSettings | None = None
    server: ServerSettings = ServerSettings()
    http: HttpSettings = HttpSettings()
    api: ApiSettings = ApiSettings()
    log: LogSettings = LogSettings()
    dhcp: DhcpSettings = DhcpSettings()
    discovery: DiscoverySettings = DiscoverySettings()
    tftp: TftpSettings = TftpSettings()
    dns: DnsSettings = DnsSettings()
    build: BuildSettings = BuildSettings()
    power: PowerSettings = PowerSettings()
    trust: TrustSettings = TrustSettings()
    metrics: MetricsSettings = MetricsSettings()
    slurm: SlurmSettings = SlurmSettings()
    peers: PeerSettings = PeerSettings()
    overlay_dirs: list[Path] = []
    """Extra overlay search dirs, searched before the state dir's and the shipped ones."""
    image_dirs: list[Path] = []
    """Extra recipe dirs, searched before the state dir's and the shipped ones."""

    @model_validator(mode="after")
    def _store_access(self) -> "Config":
        """store_tls only with an etcds:// store, store_auth only with an etcd one."""
        if self.store_tls is not None and not (self.store or "").startswith("etcds://"):
            raise ValueError(f"store_tls: for an etcds:// store (store: {self.store})")
        if self.store_auth is not None and self.store is None:
            raise ValueError("store_auth: for an etcd store (store: null)")
        return self

    @model_validator(mode="after")
    def _listeners_apart(self) -> "Config":
        api, http = self.api, self.http
        if api.bind is not None and api.port == http.port and _overlap(api.bind, http.bind):
            raise ValueError(f"api.port: {api.port} on {api.bind} is http.port on "
                             f"{http.bind} too; give the API listener another port or address")
        return self

    @model_validator(mode="after")
    def _pool_not_the_server(self) -> "Config":
        """The discovery pool never leases the server's own address."""
        pool = self.discovery.pool_range
        if pool and ":" not in self.server.address and (
                pool[0] <= ipaddress.IPv4Address(self.server.address) <= pool[1]):
            raise ValueError(f"discovery.pool: {self.discovery.pool} holds "
                             f"{self.server.address}, the server.address")
        return self

    @property
    def server_url(self) -> str:
        """The base URL nodes use to reach this server's HTTP endpoints."""
        return f"http://{url_host(self.server.address)}:{self.http.port}"

    # Paths under the state dir are named by provisiond.state.layout (Layout.of(config)),
    # which sits above this module in the import layers. These few stay until what still
    # reads them (status, inventory, trust, images.squash, tests) moves to the layout; a
    # test keeps them equal to the layout's.

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
    def trust_dir(self) -> Path:
        """Node credentials (hashed) and used provisioning tokens, one file per node."""
        return self.state_dir / "secrets" / "nodes"


def _overlap(one: str, other: str) -> bool:
    """Whether two bind addresses can clash on one port (the same, or one a wildcard)."""
    return one == other or any(ipaddress.ip_address(a).is_unspecified for a in (one, other))


def service_paths(state_dir: Path) -> Iterator[str]:
    """Every path under the state dir that the service's user must own (serve writes
    status, overlay builds, the journal...): all but the image layer cache, whose trees
    are root file systems owned as on a node."""
    for folder, dirs, files in os.walk(state_dir):
        if Path(folder) == Path(state_dir) and CACHE_NAME in dirs:
            dirs.remove(CACHE_NAME)
        yield from (os.path.join(folder, name) for name in [*dirs, *files])


def resolve_state_dir(flag: str | None) -> Path:
    """The state dir from the flag, else $PROVISIOND_STATE_DIR, else the default; absolute,
    so that no later cwd (Flask resolves relative files against its package) changes it."""
    return Path(flag or os.environ.get("PROVISIOND_STATE_DIR") or DEFAULT_STATE_DIR).absolute()


def _drop_http_threads(data: dict) -> dict:
    """Settings 1 -> 2: http.threads went with gunicorn's thread worker (gevent has none)."""
    http = data.get("http")
    if isinstance(http, dict) and "threads" in http:
        data = {**data, "http": {k: v for k, v in http.items() if k != "threads"}}
    return data


SETTINGS_SCHEMA = Schema("settings", 2, {1: _drop_http_threads})


def read_settings(path: Path) -> tuple[str, dict, int]:
    """(the file's text, its settings at the current schema, the schema it was written in);
    a missing file is ("", {}, current)."""
    if not path.exists():
        return "", {}, SETTINGS_SCHEMA.current
    text = _read_text(path)
    data = load_yaml_mapping(text, str(path), InvalidConfig, "a mapping at the top level")
    data, version = SETTINGS_SCHEMA.upgrade(data, str(path), InvalidConfig)
    return text, data, version


def load_config(state_dir: Path) -> Config:
    """Read `<state_dir>/provisiond.yaml` (an older schema migrated in memory; the CLI
    rewrites the file, see provisiond.cli.context); a missing file means all defaults."""
    state_dir = Path(state_dir).absolute()
    path = state_dir / CONFIG_NAME
    _, data, _ = read_settings(path)
    data.pop("state_dir", None)
    try:
        return Config(state_dir=state_dir, **data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "".join(f"{p}: " for p in (".".join(str(p) for p in err["loc"]),) if p)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown setting"
        raise InvalidConfig(f"{path}: {where}{message}") from None


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InvalidConfig(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidConfig(f"{path}: not UTF-8 text (byte {exc.start})") from None


def check_serving(config: Config, enabled: dict[str, bool]) -> None:
    """What `provisiond serve` needs beyond valid values, checked before anything starts:
    the TFTP root is a readable directory, DHCP (v4) has an IPv4 server.address."""
    root = config.tftp.root
    if enabled.get("tftp") and not (os.path.isdir(root) and os.access(root, os.R_OK | os.X_OK)):
        raise InvalidConfig(f"tftp.root: {root} is not a readable directory (install the "
                            "ipxe package or set tftp.root)")
    if enabled.get("dhcp") and ":" in config.server.address:
        raise InvalidConfig(f"server.address: DHCP (v4) needs an IPv4 address, not "
                            f"{config.server.address}")
    if enabled.get("api") and config.api.tls_cert:
        check_tls(config.api)


def check_tls(api: ApiSettings) -> None:
    """The certificate and key load together (gunicorn would fail on each connection)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(api.tls_cert, api.tls_key)
    except ssl.SSLError as exc:
        raise InvalidConfig(f"api.tls_cert, api.tls_key: {api.tls_cert} and {api.tls_key} are "
                            f"not a PEM certificate and its private key ({exc.reason or exc})"
                            ) from None
    except OSError as exc:
        raise InvalidConfig(f"api.tls_cert, api.tls_key: cannot read {exc.filename or ''}: "
                            f"{exc.strerror or exc}") from None


CONFIG_TEMPLATE = f"""\
# provisiond settings. Every key is optional; the values shown are the defaults
# unless noted. Changes take effect when `provisiond serve` restarts.

# The format of this file: a newer provisiond migrates an older one (keeping the
# original as provisiond.yaml.schema-N.bak), an older one refuses a newer one.
schema: {SETTINGS_SCHEMA.current}

# Where the shared documents (inventory, secrets, tokens, node status...) live. null:
# files in this state directory. etcd://HOST:PORT[,HOST:PORT...][/ROOT]: an etcd v3
# cluster shared by several boot servers (every member listed; keys under ROOT, default
# /provisiond/). Secret values are encrypted there with <state>/store.key, which each
# server keeps and etcd never sees: copy it to every server. etcds://...: the same
# over TLS (docs/store.md), checked against store_tls:
#   store_tls:
#     ca_file: /etc/provisiond/etcd-ca.pem       # absent: the system's CAs
#     cert_file: /etc/provisiond/etcd-client.pem # for members with --client-cert-auth
#     key_file: /etc/provisiond/etcd-client.key
# With etcd's authentication enabled, the user and the file of its password (0600):
#   store_auth:
#     user: provisiond
#     password_file: /etc/provisiond/etcd-password
store: null

server:
  # The address nodes use to reach this server: it goes into DHCP answers and
  # iPXE scripts. Set it to the boot network address of this host.
  address: 127.0.0.1
  # DNS domain of the nodes (n001.cluster): labels of 1-63 letters, digits, '-'.
  domain: cluster
  # Public keys put into every node's root authorized_keys (ssh overlay).
  ssh_authorized_keys: []

http:
  enabled: true
  bind: 0.0.0.0          # an IP address; "::" listens on IPv6 and IPv4
  port: 9873             # 1-65535, as every port below
  workers: 2             # 1-64
  connections: 1000      # open connections per worker, 10-100000 (idle ones close after 5 s)
  event_streams: 100     # /api/v1/events streams per worker, 1-10000 (more: 503)
  client_timeout: 30     # seconds a client may stall a receive or send, 1-3600 (then closed)

api:
  # The HTTP API (/api/v1) on a listener of its own, e.g. on a management network.
  # null: the API is served by the http listener above, beside the boot routes. An
  # address: the API listens there, and the http listener serves only what nodes fetch.
  bind: null
  port: 9874
  workers: 1             # 1-64
  # TLS for the API listener: both paths (PEM), or neither for plain HTTP.
  tls_cert: null
  tls_key: null

log:
  level: INFO            # DEBUG, INFO, WARNING or ERROR (serve --log-level overrides)
  format: text           # text, or json: one object per line for log shippers

dhcp:
  # Answers known MACs with their reserved address and a boot file.
  enabled: false
  interface: null        # e.g. br0; null listens on all
  bind: 0.0.0.0          # IPv4 only (DHCPv4)
  port: 67
  proxy: false           # true: boot information only, beside another DHCP server
  lease_seconds: 3600    # 60-4294967295 (the largest means infinite)
  discovery: false       # unknown MACs: recorded, and leased from discovery.pool
  dns_servers: []        # IPv4, at most 16; default: server.address when dns is enabled

discovery:
  # With dhcp.discovery on, unknown MACs get a short lease from this pool and boot the
  # discovery image, which reports their hardware and waits for `provisiond discover
  # approve` or a rule (<state>/discovery/rules.yaml). null: unknown MACs are only recorded.
  pool: null             # FIRST-LAST, e.g. 10.0.0.200-10.0.0.250
  netmask: 255.255.255.0
  gateway: null
  lease_seconds: 300     # 60-86400
  image: discovery       # the shipped recipe: tiny + the facts collector
  max_pending: 1000      # machines waiting for approval at most
  pending_per_address: 4 # waiting machines one source address may enlist
  reports_per_minute: 12 # reports and polls per address a minute (per HTTP worker)

tftp:
  enabled: false
  bind: 0.0.0.0
  port: 69
  root: /usr/lib/ipxe    # iPXE binaries from Debian's ipxe package; must exist to serve
  sessions_per_client: 8 # transfers at once from one address

dns:
  enabled: false
  bind: 0.0.0.0
  port: 53
  upstream: null         # address[:port], [IPv6]:port or a host name; null: NXDOMAIN
  ttl: 300               # seconds, 0-2147483647

build:
  compression: zstd      # or gzip
  workers: 0             # overlay build workers, 0-1024; 0 = one per core
  ssh_host_key_types: [ed25519, ecdsa]   # per-node host keys made; rsa is slow to make

power:
  concurrency: 32        # BMCs contacted at once, 1-4096
  timeout: 20.0          # seconds per BMC, 0.1-3600

trust:
  # Each iPXE script carries a one-time provisioning token that the node's agent
  # exchanges early in its boot for a node credential (README: Security).
  token_minutes: 10      # how long a token can be exchanged, 1-1440
  privileged_port: true  # the exchange must come from a source port below 1024 (root)

metrics:
  # GET /metrics (Prometheus) is open, as most exporters are; true: it needs a reader
  # token (bearer_token in Prometheus's scrape config).
  require_token: false

slurm:
  # What `provisiond slurm config` writes into slurm.conf (README: Slurm hand-off).
  cluster_name: cluster
  controller: null       # SlurmctldHost's short host name; null: this host's
  controller_address: null   # where slurmd reaches slurmctld; null: server.address
  suspend_time: null     # idle seconds before Slurm powers a node off; null: never
  suspend_timeout: 60
  resume_timeout: 600    # seconds for a resumed node to PXE boot and register
  resume_program: null   # null: <state>/slurm/resume (written by slurm config)
  suspend_program: null  # null: <state>/slurm/suspend
  power_log: null        # the programs' log file; null: syslog
  partition_tag: partition   # tag holding a node's partitions (comma-separated)
  default_partition: compute # partition of nodes without the tag (Default=YES)
  options: {{}}          # more slurm.conf lines, e.g. {{SlurmUser: slurm}}

peers:
  # Several boot servers (README: Several boot servers): a blob this server lacks is
  # fetched from the first of these that has it (other servers, the builder), its
  # sha256 checked before it is kept and served.
  urls: []               # HTTP base URLs, e.g. [http://10.0.0.2:9873]
  timeout: 10.0          # seconds a connect or read from a peer may wait, 0.5-300
  fetch_seconds: 300.0   # seconds one blob's fetch may take over all peers, 1-3600
"""


def write_default_config(state_dir: Path) -> Path:
    """Create the state dir with a commented provisiond.yaml; an existing file is kept."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / CONFIG_NAME
    if not path.exists():
        path.write_text(CONFIG_TEMPLATE)
    return path
