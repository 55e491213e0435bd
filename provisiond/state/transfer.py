"""Moving a site between stores (`provisiond state export|import`): every shared key of a
store as one JSON document, and back into another store, byte for byte.

The document: {"format": "provisiond-state", "version": 1, "source": URL, "revision": N,
"keys": {KEY: {"text": STR} | {"base64": STR}}}; a value is text when it is UTF-8 (so the
inventory and secrets stay readable and diffable), else base64. Secrets are in it in the
clear. What belongs to one server is left out (LOCAL): its settings, the key of the etcd
store's secret values, and the files the files store finds under the state directory that
are not shared documents (blobs, downloads, image trees but their manifests, overlay builds,
run files): each server keeps or fetches those itself.
"""

from __future__ import annotations

import base64
import binascii
import json

from provisiond.errors import AlreadyExists, InvalidInput
from provisiond.state.keys import check_key
from provisiond.state.store import Store

FORMAT = "provisiond-state"
VERSION = 1
LOCAL = ("provisiond.yaml", "store.key", "blobs/", "cache/", "overlay-builds/", "run/",
         "metrics.json")


def is_local(key: str) -> bool:
    if key.startswith("images/"):  # an image's manifest is shared, its trees are not
        parts = key.split("/")
        return len(parts) != 3 or parts[2] != "manifest.json"
    return key.startswith(LOCAL)


def shared_keys(store: Store) -> list:
    """Every entry of the store but the LOCAL ones, sorted by key."""
    return [entry for entry in store.list("") if not is_local(entry.key)]


def export_store(store: Store) -> dict:
    revision = store.revision()
    keys = {entry.key: _encode(entry.value) for entry in shared_keys(store)}
    return {"format": FORMAT, "version": VERSION, "source": store.url, "revision": revision,
            "keys": keys}


def import_store(store: Store, document: dict, force: bool = False) -> int:
    """Put every key of an exported `document` into `store`; the number of keys. Refused
    (AlreadyExists) when the store holds shared keys already, unless `force` (then the
    document's keys replace theirs; others stay)."""
    keys = _decoded(document)
    if not force:
        present = shared_keys(store)
        if present:
            raise AlreadyExists(f"{store.url} is not empty ({len(present)} keys, e.g. "
                                f"{present[0].key}); import into an empty store, or "
                                "--force to overwrite its keys")
    for key, value in keys.items():
        store.put(key, value)
    return len(keys)


def parse_document(text: str | bytes, origin: str) -> dict:
    try:
        document = json.loads(text)
    except ValueError:
        raise InvalidInput(f"{origin}: not JSON (not made by `provisiond state export`)") \
            from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise InvalidInput(f"{origin}: not a `provisiond state export` document")
    if document.get("version") != VERSION:
        raise InvalidInput(f"{origin}: export version {document.get('version')!r}, this "
                           f"provisiond reads {VERSION}")
    _decoded(document, origin)
    return document


def _encode(value: bytes) -> dict:
    try:
        return {"text": value.decode()}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode()}


def _decoded(document: dict, origin: str = "export") -> dict[str, bytes]:
    keys = document.get("keys")
    if not isinstance(keys, dict):
        raise InvalidInput(f"{origin}: 'keys' is not a mapping")
    found = {}
    for key, value in keys.items():
        try:
            check_key(key)
        except InvalidInput as exc:
            raise InvalidInput(f"{origin}: {exc}") from None
        try:
            if isinstance(value, dict) and isinstance(value.get("text"), str):
                found[key] = value["text"].encode()
            elif isinstance(value, dict) and isinstance(value.get("base64"), str):
                found[key] = base64.b64decode(value["base64"], validate=True)
            else:
                raise ValueError
        except (ValueError, binascii.Error):
            raise InvalidInput(f"{origin}: key {key!r}: neither text nor base64") from None
        if is_local(key):
            raise InvalidInput(f"{origin}: key {key!r} belongs to one server, not a store")
    return found
