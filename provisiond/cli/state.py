"""`provisiond state export|import`: move a site's shared documents between stores (the
files of a state directory, an etcd cluster)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from provisiond import audit, events
from provisiond.atomic import write_atomic
from provisiond.errors import InvalidInput
from provisiond.state.open import open_store
from provisiond.state.transfer import export_store, import_store, parse_document

WARNING = ("The file holds every secret in the clear (BMC passwords, keys, the token "
           "signing key, node credentials' hashes): it is written 0600; keep it as you keep "
           "secrets.yaml and delete it once imported.")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "state", help="export or import every shared document of the store (to move a "
        "site between the files store and etcd)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    export = verbs.add_parser(
        "export", help="write every key of the store to FILE (- for stdout), secrets included",
        description="Every key of the configured store (provisiond.yaml's store:), as JSON: "
        "text values as text, others base64. " + WARNING)
    export.add_argument("file", metavar="FILE", help="where to write (0600); - for stdout")
    export.set_defaults(func=cmd_export)
    load = verbs.add_parser(
        "import", help="put every key of an export FILE into the (empty) store",
        description="Into the configured store (provisiond.yaml's store:), which must hold no "
        "shared document yet (--force: overwrite the keys the file names). Values are "
        "written byte for byte: files -> etcd -> files gives the same files; the events "
        "and the audit record are appended to the store's as records (with new ids). "
        + WARNING)
    load.add_argument("file", metavar="FILE", help="made by `provisiond state export`; - for "
                      "stdin")
    load.add_argument("--force", action="store_true",
                      help="import into a store that holds documents already")
    load.set_defaults(func=cmd_import)


def _journals(config) -> dict:
    return {"events/": events.journal(config), "audit/": audit.journal(config)}


def cmd_export(args, ctx) -> None:
    document = export_store(open_store(ctx.config), _journals(ctx.config))
    text = json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
    else:
        try:
            write_atomic(Path(args.file), text, mode=0o600)
        except OSError as exc:
            raise InvalidInput(f"{args.file}: cannot write: {exc.strerror}") from None
    records = sum(map(len, document["journals"].values()))
    print(f"exported {len(document['keys'])} keys and {records} journal records of "
          f"{document['source']} at revision "
          f"{document['revision']} (secrets in the clear)", file=sys.stderr)


def cmd_import(args, ctx) -> None:
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{args.file}: cannot read: {exc.strerror}") from None
    store = open_store(ctx.config)
    count = import_store(store, parse_document(raw, args.file), _journals(ctx.config),
                         force=args.force)
    print(f"imported {count} keys and journal records into {store.url}", file=sys.stderr)
