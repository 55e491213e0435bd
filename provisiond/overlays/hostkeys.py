"""Per-node SSH host keys: made in-process (the `cryptography` package writes OpenSSH's own
key formats) once per node and type, kept as secrets on the store
(`secrets/ssh-host-keys/<node>/ssh_host_<type>_key[.pub]`: 0600 files in 0700 dirs with the
files store, encrypted values with etcd), offered to runtime overlays only (as
`secrets.ssh_host_keys`). Every server sharing a store gives a node the same keys, whichever
builds its overlay first: a private key is created with a compare-and-swap (only if absent),
the loser of a race takes the winner's, and a public key is what its private key says.

The types made are `build.ssh_host_key_types`: ed25519 and ecdsa (nistp256) by default, well
under a millisecond each; RSA (3072 bits, ~0.1-1 s a key) only when listed. A key already
stored is kept and still offered when its type is no longer listed, so nodes keyed by earlier
versions (which made RSA keys with ssh-keygen) keep presenting the host keys their clients
know; delete a type's two keys to drop it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from provisiond.config import Config
from provisiond.errors import BuildFailed, StaleRevision
from provisiond.state import open as opening
from provisiond.state.layout import KEYS, Layout
from provisiond.state.store import ABSENT, Entry, Store

KEY_TYPES = ("ed25519", "ecdsa", "rsa")
"""Every type a node may have, in the order they are offered."""
RSA_BITS = 3072  # ssh-keygen's default


def host_key_dir(config: Config, node: str) -> Path:
    """Where the files store keeps the node's keys."""
    return Layout.of(config).host_keys(node)


def _key_names(key_type: str) -> tuple[str, str]:
    """(private, public) key names."""
    return f"ssh_host_{key_type}_key", f"ssh_host_{key_type}_key.pub"


def _prefix(node: str) -> str:
    """The store keys of the node's keys start with this."""
    return f"{KEYS.host_keys(node)}/"


def wanted_types(config: Config) -> tuple[str, ...]:
    """The types of key to make, each once (the settings may list one twice)."""
    return tuple(dict.fromkeys(config.build.ssh_host_key_types))


def _stored(store: Store, node: str) -> dict[str, Entry]:
    """The node's stored keys by name; an empty value (a write cut short) is no key."""
    prefix = _prefix(node)
    return {e.key[len(prefix):]: e for e in store.list(prefix) if e.value}


def _has_key(stored: dict[str, Entry], key_type: str) -> bool:
    return all(name in stored for name in _key_names(key_type))


def host_key_signature(config: Config, node: str) -> tuple | None:
    """What identifies the node's keys, or None when it has none yet: their names and
    store revisions, which change whenever a key is made, replaced or deleted, here or on
    another server."""
    stored = _stored(opening.open_store(config), node)
    return tuple((name, e.revision) for name, e in sorted(stored.items())) or None


def has_host_keys(config: Config, node: str) -> bool:
    """Whether the node has every wanted type of key, whole."""
    stored = _stored(opening.open_store(config), node)
    return all(_has_key(stored, t) for t in wanted_types(config))


def make_host_keys(config: Config, node: str, durable: bool = True) -> None:
    """Make the node's wanted types of key that are missing (or empty). `durable` is for
    the callers' batches: the store makes every write durable itself."""
    store = opening.open_store(config)
    stored = _stored(store, node)
    missing = [t for t in wanted_types(config) if not _has_key(stored, t)]
    if not missing:
        return
    try:
        _private_dirs(config, store, node)
        for key_type in missing:
            _add_key(store, node, key_type, stored)
    except OSError as exc:  # a full disk fails this node's build, not the whole batch
        raise BuildFailed(f"ssh host keys for {node}: {exc.strerror or exc}") from None


def _add_key(store: Store, node: str, key_type: str, stored: dict[str, Entry]) -> None:
    """A new key of `key_type`, or the one another server stored first."""
    private_name, public_name = _key_names(key_type)
    private = stored.get(private_name)
    if private is None:
        data = _new_private(key_type)
        try:
            store.put(_prefix(node) + private_name, data, expect=ABSENT)
            value = data
        except StaleRevision:  # made meanwhile (another server, a crash's empty file)
            value = _taken_over(store, node, private_name, data)
    else:
        value = private.value
    store.put(_prefix(node) + public_name, _public_of(value, node))


def _taken_over(store: Store, node: str, name: str, data: bytes) -> bytes:
    """The private key another writer stored first; an empty one left by a cut write is
    replaced by `data`, unless another writer replaces it first (then theirs: two servers
    replacing it at once failed the second's build with StaleRevision)."""
    key = _prefix(node) + name
    for _ in range(3):
        entry = store.get(key)
        if entry is not None and entry.value:
            return entry.value
        try:
            store.put(key, data, expect=entry.revision if entry else ABSENT)
            return data
        except StaleRevision:
            continue
    raise BuildFailed(f"ssh host keys for {node}: {key} changed under three writes; "
                      "build again")


def _private_dirs(config: Config, store: Store, node: str) -> None:
    """With the files store, the key dirs are 0700 (the state dir may be world-readable)."""
    if store.url != f"files://{config.state_dir}":
        return
    folder = host_key_dir(config, node)
    for path in (folder.parent, folder):
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.stat().st_mode & 0o777 != 0o700:
            os.chmod(path, 0o700)


def read_host_keys(config: Config, node: str) -> dict[str, dict[str, str]]:
    """{type: {"private": ..., "public": ...}} for every whole key the node has."""
    stored = _stored(opening.open_store(config), node)
    return {t: {"private": _text(stored[private], node), "public": _text(stored[public], node)}
            for t in KEY_TYPES if _has_key(stored, t)
            for private, public in [_key_names(t)]}


def _text(entry: Entry, node: str) -> str:
    try:
        return entry.value.decode()
    except UnicodeDecodeError:  # a damaged key failed the build with a traceback
        raise _damaged(node, f"{entry.key} is not text") from None


def _damaged(node: str, why: str) -> BuildFailed:
    return BuildFailed(f"ssh host keys for {node}: {why}; "
                       f"`provisiond secret rotate {node} ssh-host-keys`")


def host_key_types(config: Config, node: str) -> list[str]:
    """The types of key the node's build offers (ensure_host_keys), found without making
    any: the wanted types and the older ones it has stored, in offering order."""
    stored = _stored(opening.open_store(config), node)
    wanted = wanted_types(config)
    return [t for t in KEY_TYPES if t in wanted or _has_key(stored, t)]


def ensure_host_keys(config: Config, node: str, durable: bool = True
                     ) -> dict[str, dict[str, str]]:
    """The node's keys (read_host_keys), making missing wanted types first."""
    make_host_keys(config, node, durable)
    return read_host_keys(config, node)


def _new_private(key_type: str) -> bytes:
    """A new private key in OpenSSH's format."""
    # Imported here: every CLI command imports this module, few make keys (~35 ms).
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if key_type == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
    elif key_type == "ecdsa":
        key = ec.generate_private_key(ec.SECP256R1())  # nistp256, ssh-keygen's default
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())


def _public_of(private: bytes, node: str) -> bytes:
    """The public key line of an OpenSSH private key (what `ssh-keygen -y` prints), with
    the comment root@<node>: whoever writes it writes the same bytes."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_ssh_private_key(private, password=None)
    except (ValueError, TypeError) as exc:
        raise _damaged(node, f"a stored private key cannot be read ({exc})") from None
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    return public + f" root@{node}\n".encode()


def rotate_host_keys(config: Config, node: str) -> None:
    """New keys for every type the node has or wants, each replacing the old one (the
    keys' revisions change, so the node's runtime build is made again on every server)."""
    store = opening.open_store(config)
    stored = _stored(store, node)
    try:
        _private_dirs(config, store, node)
        for key_type in KEY_TYPES:
            if key_type in wanted_types(config) or _has_key(stored, key_type):
                private_name, public_name = _key_names(key_type)
                data = _new_private(key_type)
                store.put(_prefix(node) + private_name, data)  # private first
                store.put(_prefix(node) + public_name, _public_of(data, node))
    except OSError as exc:
        raise BuildFailed(f"ssh host keys for {node}: {exc.strerror or exc}") from None


def sync_new_keys() -> None:
    """One sync after a batch build (its caller's contract). The store makes each key
    durable as it writes it, so this only flushes what else the batch wrote."""
    os.sync()


def forget_host_keys(config: Config, node: str) -> None:
    """Delete a node's keys (a new set is made on its next runtime build), the directory the
    files store kept them in, and the lock files earlier versions kept there."""
    store = opening.open_store(config)
    for entry in store.list(_prefix(node)):
        store.delete(entry.key)
    shutil.rmtree(host_key_dir(config, node), ignore_errors=True)
    Layout.of(config).host_keys_old_lock(node).unlink(missing_ok=True)
