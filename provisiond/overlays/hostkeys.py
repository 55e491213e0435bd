"""Per-node SSH host keys: made in-process (the `cryptography` package writes OpenSSH's own
key formats) once per node and type, kept 0600 under the state dir, offered to runtime
overlays only (as `secrets.ssh_host_keys`).

The types made are `build.ssh_host_key_types`: ed25519 and ecdsa (nistp256) by default, well
under a millisecond each; RSA (3072 bits, ~0.1-1 s a key) only when listed. A key already on
disk is kept and still offered when its type is no longer listed, so nodes keyed by earlier
versions (which made RSA keys with ssh-keygen) keep presenting the host keys their clients
know; delete a type's two files to drop it.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from provisiond.atomic import fsync_dir, locked, write_atomic
from provisiond.config import Config
from provisiond.errors import BuildFailed
from provisiond.state.layout import Layout
from provisiond.state.local import Stamp, file_stamp

KEY_TYPES = ("ed25519", "ecdsa", "rsa")
"""Every type a node may have, in the order they are offered."""
RSA_BITS = 3072  # ssh-keygen's default


def host_key_dir(config: Config, node: str) -> Path:
    return Layout.of(config).host_keys(node)


def _key_names(key_type: str) -> tuple[str, str]:
    """(private, public) file names."""
    return f"ssh_host_{key_type}_key", f"ssh_host_{key_type}_key.pub"


def wanted_types(config: Config) -> tuple[str, ...]:
    """The types of key to make, each once (the settings may list one twice)."""
    return tuple(dict.fromkeys(config.build.ssh_host_key_types))


def host_key_signature(layout: Layout, node: str) -> Stamp | None:
    """What identifies the node's key files, or None when it has none yet: their
    directory's stamp (its mtime changes whenever a key file is made, renamed in or
    deleted: every write here is a rename). One stat, so a build of 10,000 nodes can tell
    whether keys changed without reading them (listing and stat-ing each file cost ~0.3 s);
    a key file edited in place is not seen: replace it by renaming a new file over it."""
    return file_stamp(layout.host_keys(node))


def _stat(path: Path) -> bool:
    """Whether the file exists and is not empty (a write cut short by a crash)."""
    try:
        return os.stat(path).st_size > 0
    except FileNotFoundError:
        return False


def _has_key(folder: Path, key_type: str) -> bool:
    return all(_stat(folder / name) for name in _key_names(key_type))


def has_host_keys(config: Config, node: str) -> bool:
    """Whether the node has every wanted type of key, whole."""
    folder = host_key_dir(config, node)
    return all(_has_key(folder, t) for t in wanted_types(config))


def make_host_keys(config: Config, node: str, durable: bool = True) -> None:
    """Make the node's wanted types of key that are missing (or empty). With
    `durable=False` the new files are not fsynced: the caller syncs once after making many
    (see sync_new_keys)."""
    if has_host_keys(config, node):
        return
    try:
        _make_missing_keys(config, node, durable)
    except OSError as exc:  # a full disk fails this node's build, not the whole batch
        raise BuildFailed(f"ssh host keys for {node}: {exc.strerror or exc}") from None


def _make_missing_keys(config: Config, node: str, durable: bool) -> None:
    folder = host_key_dir(config, node)
    _make_private_parent(folder.parent)
    if not folder.exists() and _make_key_dir(folder, node, config, durable):
        return
    # another builder may be making the same node's keys
    with locked(Layout.of(config).host_keys_lock(node)):
        for key_type in wanted_types(config):
            if not _has_key(folder, key_type):
                for name, data in _new_key(node, key_type):  # private first
                    write_atomic(folder / name, data, mode=0o600, durable=durable)


def _make_key_dir(folder: Path, node: str, config: Config, durable: bool) -> bool:
    """A new node's keys, written into a temp directory renamed into place: one rename
    instead of one per file (file system metadata is what a 10,000-node build waits on).
    False when another builder made the directory first."""
    tmp = tempfile.mkdtemp(prefix=f".{node}.", dir=folder.parent)  # mode 0700
    try:
        for key_type in wanted_types(config):
            for name, data in _new_key(node, key_type):
                _write_new(f"{tmp}/{name}", data, durable)
        if durable:
            fsync_dir(Path(tmp))
        try:
            os.rename(tmp, folder)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        if durable:
            fsync_dir(folder.parent)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only when the rename did not happen


def _write_new(path: str, data: bytes, durable: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        if durable:
            handle.flush()
            os.fsync(fd)


def read_host_keys(config: Config, node: str) -> dict[str, dict[str, str]]:
    """{type: {"private": ..., "public": ...}} for every whole key the node has."""
    folder = host_key_dir(config, node)
    return {t: {"private": (folder / private).read_text(),
                "public": (folder / public).read_text()}
            for t in KEY_TYPES if _has_key(folder, t)
            for private, public in [_key_names(t)]}


def host_key_types(config: Config, node: str) -> list[str]:
    """The types of key the node's build offers (ensure_host_keys), found without making
    any: the wanted types and the older ones it has on disk, in offering order."""
    folder = host_key_dir(config, node)
    wanted = wanted_types(config)
    return [t for t in KEY_TYPES if t in wanted or _has_key(folder, t)]


def ensure_host_keys(config: Config, node: str, durable: bool = True
                     ) -> dict[str, dict[str, str]]:
    """The node's keys (read_host_keys), making missing wanted types first."""
    make_host_keys(config, node, durable)
    return read_host_keys(config, node)


def _make_private_parent(parent: Path) -> None:
    """The directory of all nodes' key dirs, 0700 (the state dir may be world-readable)."""
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if parent.stat().st_mode & 0o777 != 0o700:
        os.chmod(parent, 0o700)


def _new_key(node: str, key_type: str) -> list[tuple[str, bytes]]:
    """A new key pair as [(private file name, data), (public file name, data)]."""
    # Imported here: every CLI command imports this module, few make keys (~35 ms).
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if key_type == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
    elif key_type == "ecdsa":
        key = ec.generate_private_key(ec.SECP256R1())  # nistp256, ssh-keygen's default
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    private_name, public_name = _key_names(key_type)
    return [(private_name, private), (public_name, public + f" root@{node}\n".encode())]


def rotate_host_keys(config: Config, node: str) -> None:
    """New keys for every type the node has or wants, each file renamed over the old one
    (the key directory's signature changes, so the node's runtime build is made again)."""
    folder = host_key_dir(config, node)
    if not folder.is_dir():
        make_host_keys(config, node)
        return
    try:
        with locked(Layout.of(config).host_keys_lock(node)):
            for key_type in KEY_TYPES:
                if key_type in wanted_types(config) or _has_key(folder, key_type):
                    for name, data in _new_key(node, key_type):  # private first
                        write_atomic(folder / name, data, mode=0o600)
    except OSError as exc:
        raise BuildFailed(f"ssh host keys for {node}: {exc.strerror or exc}") from None


def sync_new_keys() -> None:
    """Make keys written with durable=False survive a power cut (one sync for a batch,
    instead of two fsyncs per file: 40,000 of them for 10,000 nodes)."""
    os.sync()


def forget_host_keys(config: Config, node: str) -> None:
    """Delete a node's keys (a new set is made on its next runtime build), and the lock
    file that earlier builds kept beside its key directory."""
    shutil.rmtree(host_key_dir(config, node), ignore_errors=True)
    Layout.of(config).host_keys_old_lock(node).unlink(missing_ok=True)
