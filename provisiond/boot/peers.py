"""Blobs this server lacks, fetched from its peers (other boot servers, the builder).

A blob is named by its sha256, so any copy can be checked: the bytes stream into a temp file
in the blob store while they are hashed, and only a copy whose digest is the one asked for
is renamed into place. A peer that answers with other bytes (a corrupted disk, a cut
connection) is passed over for the next; when none has a good copy the request gets an error
and the store keeps nothing of it. One fetch per digest at a time, across the workers of a
server (a lock file per digest): a boot storm asking a new server for one layer fetches it
once. Every wait is bounded by `peers.timeout` (one socket wait) and `peers.fetch_seconds`
(the whole fetch, waiting for another's included).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from provisiond.boot.artifacts import blob_file
from provisiond.config import Config
from provisiond.errors import ProvisiondError, Unavailable
from provisiond.images.blobs import BlobNotFound, open_blob
from provisiond.images.manifests import listed_size
from provisiond.state.layout import Layout

log = logging.getLogger("provisiond.boot")
PEER_HEADER = "X-Provisiond-Peer"
"""Sent with a fetch from a peer: the answer comes from the peer's own store only, never
fetched onward (two servers lacking a blob would otherwise ask each other in turn)."""
CHUNK = 1 << 20
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Peers are asked directly: urlopen went through $http_proxy (set on a builder for apt and
debootstrap), which a proxy outside the boot network answers with an error or not at all."""
LOCK_POLL = 0.02  # seconds between tries of a digest's fetch lock (cooperative under gevent)


class BlobUnavailable(ProvisiondError):
    """No peer gave a good copy of a blob this server lacks (unreachable, or other bytes)."""

    code = "blob_unavailable"
    http_status = 502


class _PeerFailed(Exception):
    """One peer did not give the blob; `missing`: it said it has none (404)."""

    def __init__(self, reason: str, missing: bool = False):
        super().__init__(reason)
        self.missing = missing


def local_or_fetched(config: Config, hexdigest: str) -> Path:
    """The blob's path in the local store, fetched from the peers first when it is not
    there. BlobNotFound when no peer has it, BlobUnavailable when none gave a good copy."""
    path = blob_file(config, hexdigest)
    if path.is_file() or not config.peers.urls:
        return path
    deadline = time.monotonic() + config.peers.fetch_seconds
    with _fetch_lock(config, hexdigest, deadline):
        if not path.is_file():  # else fetched by another request while this one waited
            _fetch(config, hexdigest, deadline)
    return path


def _fetch(config: Config, hexdigest: str, deadline: float) -> None:
    failures: list[_PeerFailed] = []
    limit = _size_limit(config, hexdigest)
    for url in config.peers.urls:
        try:
            _fetch_from(config, url, hexdigest, deadline, limit)
            return
        except _PeerFailed as exc:
            log.warning("blob sha256:%s from %s: %s", hexdigest[:12], url, exc)
            failures.append(exc)
        if time.monotonic() >= deadline:
            break
    if failures and all(f.missing for f in failures):
        raise BlobNotFound(f"no blob sha256:{hexdigest} here nor on the peers")
    reasons = "; ".join(str(f) for f in failures) or "no peer tried"
    raise BlobUnavailable(f"blob sha256:{hexdigest} is not here and no peer gave a good "
                          f"copy: {reasons}")


def _size_limit(config: Config, hexdigest: str) -> int | None:
    """The size the manifests list for the blob; None (bounded in time only) when none
    does, or when the store cannot be read (the peers may still have the blob)."""
    try:
        return listed_size(config, f"sha256:{hexdigest}")
    except ProvisiondError as exc:
        log.warning("blob sha256:%s: no size from the manifests (%s)", hexdigest[:12], exc)
        return None


def _fetch_from(config: Config, base: str, hexdigest: str, deadline: float,
                limit: int | None) -> None:
    """Stream the peer's copy into a temp file, hashing it; keep it only if it matches.
    `limit`: the size the manifests list (a longer copy is cut off and refused)."""
    url = f"{base}/blobs/sha256/{hexdigest}"
    request = urllib.request.Request(url, headers={PEER_HEADER: "1"})
    timeout = min(config.peers.timeout, max(deadline - time.monotonic(), 0.1))
    try:
        with DIRECT.open(request, timeout=timeout) as response, \
                open_blob(config) as blob:
            _copy(response, blob.hashing, deadline, url, limit)
            got = blob.hashing.sha.hexdigest()
            if got != hexdigest:
                raise _PeerFailed(f"{url}: its copy has sha256 {got} ({blob.size} bytes): "
                                  "refused")
            blob.commit()
    except urllib.error.HTTPError as exc:
        raise _PeerFailed(f"{url}: HTTP {exc.code}", missing=exc.code == 404) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # refused, reset, timed out, cut short (IncompleteRead), not HTTP
        raise _PeerFailed(f"{url}: {getattr(exc, 'reason', None) or exc}") from None


def _copy(response, target, deadline: float, url: str, limit: int | None) -> None:
    # read1: what one socket read gives. read(CHUNK) waits for the whole chunk, so a peer
    # sending a byte now and then (each within peers.timeout) held it past the deadline.
    while chunk := response.read1(CHUNK):
        target.write(chunk)
        if limit is not None and target.size > limit:
            raise _PeerFailed(f"{url}: sends more than the {limit} bytes its manifest lists: "
                              "refused")
        if time.monotonic() > deadline:
            raise _PeerFailed(f"{url}: not done within peers.fetch_seconds")


@contextlib.contextmanager
def _fetch_lock(config: Config, hexdigest: str, deadline: float) -> Iterator[None]:
    """Hold the digest's fetch lock (an flock: every request and worker of this server
    opens the file anew, so each excludes the others); polled so that a gevent worker's
    other connections go on meanwhile. The holder removes the file, fetch done or failed
    (a client asking for made-up digests left one file each); a request that waited on a
    removed file locks the one there now, or two would fetch at once."""
    lock = Layout.of(config).blob_fetch_lock(hexdigest)  # beside sha256/: gc never sees it
    while True:
        with _opened(lock, hexdigest) as handle:
            _wait_for_lock(handle, hexdigest, deadline)
            if _is_current(handle, lock):
                try:
                    yield
                finally:
                    lock.unlink(missing_ok=True)  # before the close releases the lock
                return


def _opened(lock: Path, hexdigest: str):
    """The lock file, opened; a state dir that cannot hold it (full, read-only) is
    Unavailable, not an internal error."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return open(lock, "a")
    except OSError as exc:
        raise Unavailable(f"blob sha256:{hexdigest}: cannot take its fetch lock "
                          f"({exc.strerror or exc})") from None


def _wait_for_lock(handle, hexdigest: str, deadline: float) -> None:
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() > deadline:
            raise Unavailable(f"blob sha256:{hexdigest}: still being fetched by another "
                              "request; try again")
        time.sleep(LOCK_POLL)


def _is_current(handle, lock: Path) -> bool:
    """Whether the locked file is still the one at `lock` (not removed by its holder)."""
    try:
        return os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False
