"""Secrets (BMC passwords, tokens, keys) apart from the inventory: `secrets.yaml` on the store
(a 0600 YAML file with the files store, encrypted in etcd).

Values are never printed, returned by the API, logged or put in an argv. A node's runtime
templates see its profiles' secrets and its own (`secrets["munge.key"]`; the node's own
win, then profiles right to left), except the server's own (`bmc_password`).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from provisiond.config import Config
from provisiond.documents import DuplicateKey, YamlLoader
from provisiond.errors import InvalidInput
from provisiond.inventory.merge import Node
from provisiond.inventory.store import dump_yaml
from provisiond.state import open as opening
from provisiond.state.files import StoreFileError
from provisiond.state.layout import KEYS, Layout

KEY = str(KEYS.secrets)

BMC_PASSWORD = "bmc_password"
SERVER_ONLY = frozenset({BMC_PASSWORD})
"""Secrets the server uses itself: never given to a node's templates."""
GENERATED = frozenset({"ssh_host_keys"})
"""Names templates already use for secrets the server makes (provisiond.overlays.hostkeys)."""


class SecretStore:
    """`secrets.yaml`: {nodes: {NAME: {KEY: VALUE}}, profiles: {...}}."""

    def __init__(self, config: Config):
        self.store = opening.open_store(config)
        self.path = Layout.of(config).secrets  # what messages name

    def read(self) -> dict:
        """The secrets; an unreadable, invalid or non-mapping file is an error (never taken
        for an empty one, which the next write would make true), shown without its text."""
        try:
            entry = self.store.get(KEY)
        except StoreFileError as exc:  # a directory there, no permission: never {}
            raise InvalidInput(f"{self.path}: cannot read: {str(exc).rpartition(': ')[2]}") \
                from None
        return self._parse(entry.value) if entry else {}

    def _parse(self, raw: bytes) -> dict:
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise InvalidInput(f"{self.path}: cannot read: not UTF-8") from None
        try:
            data = yaml.load(text, Loader=YamlLoader) or {}
        except DuplicateKey as exc:  # names a key and lines, never a value
            raise InvalidInput(f"{self.path}: {exc}") from None
        except yaml.YAMLError:  # its message quotes the file: secrets
            raise InvalidInput(f"{self.path}: not valid YAML") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"{self.path}: expected a mapping of nodes and profiles")
        return data

    def get(self, kind: str, name: str, key: str) -> str | None:
        return (self.read().get(kind) or {}).get(name, {}).get(key)

    def set(self, kind: str, names: list[str], key: str, value: str | None) -> list[str]:
        """Set (or with None, remove) `key` for each name of `kind` (nodes or profiles);
        the names whose value changed (removing: those that had one). No change, no write."""
        changed: list[str] = []

        def change(data: dict) -> dict:
            changed.clear()  # compare-and-swap may call this again on newer data
            group = data.setdefault(kind, {})
            for name in names:
                entry = group.setdefault(name, {})
                if entry.get(key) != value:
                    changed.append(name)
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = value
                if not entry:
                    group.pop(name)
            return data

        group = self.read().get(kind) or {}
        if value is None and not any(key in (group.get(name) or {}) for name in names):
            return []  # nothing to remove: nothing written
        self._update(change)
        return changed

    def forget(self, kind: str, names: list[str]) -> None:
        def change(data: dict) -> dict:
            for name in names:
                (data.get(kind) or {}).pop(name, None)
            return data

        if any(name in (self.read().get(kind) or {}) for name in names):
            self._update(change)

    def _update(self, change) -> None:
        """Apply `change` (the secrets -> the new ones) by compare-and-swap."""
        self.store.update(KEY, lambda raw: dump_yaml(
            change(self._parse(raw) if raw is not None else {})).encode())


def runtime_secrets(data: dict, node: Node) -> dict[str, str]:
    """The secrets `node`'s runtime templates see, from the store's `data`: its profiles'
    (right wins) then its own, without the server's own."""
    merged: dict = {}
    for profile in node.record.profiles or []:
        merged.update((data.get("profiles") or {}).get(profile) or {})
    merged.update((data.get("nodes") or {}).get(node.name) or {})
    return {k: v for k, v in merged.items()
            if isinstance(k, str) and isinstance(v, str) and k not in SERVER_ONLY}


def bmc_password(config: Config, node: Node) -> str | None:
    """The node's BMC password, as every field merges: the node's own first, then its
    profiles' right to left; at each, its bmc_password secret, else the content of its
    bmc.password_file (the merged record's provenance says whose that is)."""
    data = SecretStore(config).read()
    holders = [("node", (data.get("nodes") or {}).get(node.name))]
    holders += [(f"profile:{p}", (data.get("profiles") or {}).get(p))
                for p in reversed(node.record.profiles or [])]
    file_of = node.provenance.get("bmc.password_file")
    for holder, secrets in holders:
        value = (secrets or {}).get(BMC_PASSWORD)
        if value is not None:
            return value
        if holder == file_of:
            break
    bmc = node.record.bmc
    return read_password_file(node.name, bmc.password_file) if bmc and bmc.password_file \
        else None


def read_password_file(node: str, path: str) -> str:
    try:
        return Path(os.path.expanduser(path)).read_text().strip()
    except OSError as exc:
        raise InvalidInput(f"node {node}: bmc.password_file: cannot read {path}: "
                           f"{exc.strerror}") from None
    except UnicodeDecodeError:  # its message quotes a byte of the password
        raise InvalidInput(f"node {node}: bmc.password_file: {path} is not UTF-8 text") \
            from None
