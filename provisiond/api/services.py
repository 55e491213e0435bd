"""What the HTTP views share within one worker: the config, the boot table, manifests,
scripts and overlays."""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

from flask import current_app, request

from provisiond.boot.artifacts import LruCache, ManifestCache, OverlayFiles
from provisiond.boot.ipxe import ScriptCache
from provisiond.boot.phases import recorder_from_env
from provisiond.boot.table import BootTable, TableWatcher
from provisiond.config import Config
from provisiond.errors import NodeNotFound
from provisiond.images.blobs import file_sha256
from provisiond.state.local import file_stamp
from provisiond.state import open as opening
from provisiond.state.watched import follow
from provisiond.trust import RefusalLog, authenticate

log = logging.getLogger("provisiond.boot")
STEP_KEY = "provisiond.boot_step"
ETAGS_KEPT = 4096  # overlay ETags: a refresh storm of this many nodes hashes nothing twice


class BootServices:
    def __init__(self, config: Config):
        self.config = config
        store = opening.open_store(config)
        self.reads = follow(store)
        """What requests read: on etcd a copy its watch keeps (provisiond.state.watched),
        looked at with every request; on files the store, looked at once a second."""
        interval = 0.0 if self.reads is not store else 1.0
        self.watcher = TableWatcher(config, interval=interval, reads=self.reads)
        self.manifests = ManifestCache(config, interval=interval, reads=self.reads)
        self.scripts = ScriptCache(config, self.manifests, reads=self.reads)
        self.overlays = OverlayFiles(config, table=lambda: self.table, reads=self.reads)
        self._etags = LruCache(ETAGS_KEPT)  # path -> (stat stamp, sha256)
        self._phases = None
        self.refusals = RefusalLog(config)

    @property
    def phases(self):
        """Phase writes leave the request path (made in the worker, after gunicorn's fork)."""
        if self._phases is None:
            self._phases = recorder_from_env(self.config)
        return self._phases

    @property
    def table(self) -> BootTable:
        return self.watcher.current()

    def node(self, name: str):
        node = self.table.nodes.get(name)
        if node is None:
            raise NodeNotFound(f"no node named {name!r}")
        return node

    def file_etag(self, path: Path) -> str:
        """sha256 of a file, remembered (for the last ETAGS_KEPT paths) until it changes."""
        stamp = file_stamp(path)  # a build renamed in: a new inode
        if stamp is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        cached = self._etags.get(str(path))
        if cached and cached[0] == stamp:
            return cached[1]
        digest = file_sha256(path)
        self._etags.put(str(path), (stamp, digest))
        return digest


def services() -> BootServices:
    return current_app.extensions["provisiond"]


def client_address(environ: dict | None = None) -> str:
    """The peer's address; an IPv4-mapped one (an http.bind of "::") as plain IPv4."""
    address = (environ if environ is not None else request.environ).get("REMOTE_ADDR") or ""
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def client_port(environ: dict | None = None) -> int | None:
    """The peer's TCP port (gunicorn's REMOTE_PORT), or None if unknown."""
    port = (environ if environ is not None else request.environ).get("REMOTE_PORT")
    return int(port) if str(port or "").isdigit() else None


def require_credential(node) -> None:
    """Pass only a request carrying the node's credential, from one of its addresses
    (raises Unauthenticated or Forbidden)."""
    svc = services()
    authenticate(svc.config, node, request.headers.get("Authorization"), client_address(),
                 reads=svc.reads)


def log_step(node: str, what: str, started: float, environ: dict | None = None) -> None:
    """Note the boot step of this request; `log_sent` writes its line once the body is out."""
    (environ if environ is not None else request.environ)[STEP_KEY] = (node, what, started)


def log_sent(environ: dict, status, sent: int | None) -> None:
    """One log line per boot step (node, what, size, time): gunicorn's post_request hook."""
    step = environ.get(STEP_KEY)
    if step:
        node, what, started = step
        log.info("%s %s %s %s bytes %.1f ms from %s", node, what, status,
                 "-" if sent is None else sent, (time.monotonic() - started) * 1000,
                 environ.get("REMOTE_ADDR"))
