"""Moving a site between stores (`provisiond state export|import`): every shared key of a
store as one JSON document, and back into another store, byte for byte.

The document: {"format": "provisiond-state", "version": 1, "source": URL, "revision": N,
"keys": {KEY: {"text": STR} | {"base64": STR}}, "journals": {PREFIX: [RECORD...]}}; a value
is text when it is UTF-8 (so the inventory and secrets stay readable and diffable), else
base64. Secrets are in it in the clear. The journals (events, the audit record) are their
records, oldest first, without ids: a file of JSON lines on the files store is one key per
record on etcd, and copied as keys neither store read the other's (the audit record was
lost on the way, and its file could be too large for one etcd request); an import appends
them to the target's journals, which give them ids of their own. What belongs to one
server is left out (LOCAL): its settings, the key of the etcd store's secret values, and
the files the files store finds under the state directory that are not shared documents
(blobs, downloads, image trees but their manifests, overlay builds, run files): each server
keeps or fetches those itself.
"""

from __future__ import annotations

import base64
import binascii
import json

from provisiond.errors import AlreadyExists, InvalidInput
from provisiond.journal import Journal, StoreJournal
from provisiond.state.keys import check_key
from provisiond.state.store import Store

FORMAT = "provisiond-state"
VERSION = 1
LOCAL = ("provisiond.yaml", "store.key", "blobs/", "cache/", "overlay-builds/", "run/",
         "metrics.json")


JOURNAL_PREFIXES = ("events/", "audit/")
Journals = dict[str, "Journal | StoreJournal"]
"""A store's journals by key prefix (provisiond.events.journal, provisiond.audit.journal)."""


def in_journal(key: str) -> bool:
    """A key of a journal: its records (or file), its lock, its note of what was trimmed."""
    return any(key.startswith(prefix) or key == prefix.rstrip("/") + ".trimmed"
               for prefix in JOURNAL_PREFIXES)


def is_local(key: str) -> bool:
    if key.startswith("images/"):  # an image's manifest is shared, its trees are not
        parts = key.split("/")
        return len(parts) != 3 or parts[2] != "manifest.json"
    return key.startswith(LOCAL)


def shared_keys(store: Store) -> list:
    """Every entry of the store but the LOCAL ones, sorted by key."""
    return [entry for entry in store.list("") if not is_local(entry.key)]


def export_store(store: Store, journals: Journals) -> dict:
    revision = store.revision()
    keys = {entry.key: _encode(entry.value) for entry in shared_keys(store)
            if not in_journal(entry.key)}
    records = {prefix: [_without_id(record) for record in journal.read_since(0, 1 << 62)]
               for prefix, journal in journals.items()}
    return {"format": FORMAT, "version": VERSION, "source": store.url, "revision": revision,
            "keys": keys, "journals": records}


def import_store(store: Store, document: dict, journals: Journals, force: bool = False) -> int:
    """Put every key of an exported `document` into `store` and append its journals'
    records to `journals`; the number of keys and records. Refused (AlreadyExists) when the
    store holds shared keys already, unless `force` (then the document's keys replace
    theirs; others stay, and its records follow the journals' own)."""
    keys = _decoded(document)
    records = _journal_records(document, journals)
    if not force:
        present = shared_keys(store)
        if present:
            raise AlreadyExists(f"{store.url} is not empty ({len(present)} keys, e.g. "
                                f"{present[0].key}); import into an empty store, or "
                                "--force to overwrite its keys")
    for key, value in keys.items():
        store.put(key, value)
    for prefix, journal in journals.items():
        for record in records.get(prefix, []):
            journal.append(record)
    return len(keys) + sum(map(len, records.values()))


def _without_id(record: dict) -> dict:
    return {name: value for name, value in record.items() if name != "id"}


def _journal_records(document: dict, journals: Journals, origin: str = "export"
                     ) -> dict[str, list[dict]]:
    found = document.get("journals", {})
    if not isinstance(found, dict) or any(
            prefix not in journals or not isinstance(records, list)
            or not all(isinstance(record, dict) for record in records)
            for prefix, records in found.items()):
        raise InvalidInput(f"{origin}: 'journals' is not a mapping of "
                           f"{', '.join(journals)} to lists of records")
    return found


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
    _journal_records(document, dict.fromkeys(JOURNAL_PREFIXES), origin)
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
