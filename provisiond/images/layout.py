"""OCI image manifests and layouts for imports: pick the linux/amd64 image of an index,
check a manifest's shape and media types, and copy one image, every blob checked against
its digest and size, into a fresh OCI layout folder (the `oci-archive` base builds it).

Sources are the registry client (provisiond.images.registry) and `oci:DIR[:TAG]` layouts;
both hand blobs over as streams, so a blob is verified once, on its way in."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from provisiond.errors import BuildFailed, InvalidInput, NotFound
from provisiond.images.blobs import file_sha256

# What a registry or a layout may answer: indexes (manifest lists) and image manifests.
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
# Layers apply_layer unpacks (it sniffs gzip and zstd itself).
LAYER_TYPES = frozenset({
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
})
# The distribution registry refuses manifests over 4 MiB; so do we, before parsing.
MAX_MANIFEST = 4 << 20
PLATFORM = ("linux", "amd64")
REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20


class ImportFailed(BuildFailed):
    """An image could not be fetched or its content is not what its digest says."""


class ImageRefNotFound(NotFound):
    """The registry or layout has no such repository, tag or digest."""


def check_digest(digest) -> str:
    """A sha256 digest as descriptors write it; anything else is refused (it names a path)."""
    algo, _, hexdigest = str(digest).partition(":")
    if algo != "sha256" or len(hexdigest) != 64 or not all(
            c in "0123456789abcdef" for c in hexdigest):
        raise ImportFailed(f"unsupported or malformed digest {str(digest)[:80]!r}")
    return digest


def verify_document(data: bytes, digest: str | None, what: str) -> dict:
    """A manifest or index: at most MAX_MANIFEST bytes, matching `digest`, a JSON object."""
    if len(data) > MAX_MANIFEST:
        raise ImportFailed(f"{what}: the manifest is larger than {MAX_MANIFEST >> 20} MiB")
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if digest and actual != digest:
        raise ImportFailed(f"{what}: digest mismatch: expected {digest}, got {actual}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: '[' * 100000
        raise ImportFailed(f"{what}: the manifest is not JSON") from None
    if not isinstance(doc, dict):
        raise ImportFailed(f"{what}: the manifest is not a JSON object")
    return doc


def media_type(doc: dict, header: str | None = None) -> str:
    """The document's media type: its own field, else the Content-Type it came with."""
    found = doc.get("mediaType") or (header or "").split(";")[0].strip()
    if not found and "manifests" in doc:
        return OCI_INDEX
    if not found and "layers" in doc:
        return OCI_MANIFEST
    return found


def pick_platform(index: dict, what: str) -> dict:
    """The index entry for linux/amd64 (an entry without a platform counts as it)."""
    entries = index.get("manifests")
    entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    if not entries:
        raise ImportFailed(f"{what}: the index lists no manifests")
    offered = []
    for entry in entries:
        platform = entry.get("platform")
        if platform is None:
            return entry
        if not isinstance(platform, dict):
            offered.append(repr(platform)[:40])
            continue
        if (platform.get("os"), platform.get("architecture")) == PLATFORM:
            return entry
        offered.append(f"{platform.get('os')}/{platform.get('architecture')}")
    raise ImportFailed(f"{what}: no linux/amd64 image (the index has "
                       f"{', '.join(sorted(set(offered)))})")


def check_manifest(doc: dict, kind: str, what: str) -> list[dict]:
    """The blobs an image manifest names (config first), refused unless we can unpack them."""
    if kind not in MANIFESTS or doc.get("schemaVersion") != 2:
        raise ImportFailed(f"{what}: not an OCI or docker v2 image manifest "
                           f"(media type {kind or 'none'!r})")
    config, layers = doc.get("config"), doc.get("layers")
    if not isinstance(config, dict) or not isinstance(layers, list) or not layers:
        raise ImportFailed(f"{what}: the manifest has no config or no layers")
    for layer in layers:
        if not isinstance(layer, dict) or not isinstance(layer.get("mediaType"), str) \
                or layer["mediaType"] not in LAYER_TYPES:
            kind = layer.get("mediaType") if isinstance(layer, dict) else layer
            raise ImportFailed(f"{what}: layer media type {kind!r} cannot be unpacked "
                               f"(tar, tar+gzip or tar+zstd only)")
    for blob in [config, *layers]:
        check_digest(blob.get("digest"))
        if not isinstance(blob.get("size"), int) or blob["size"] < 0:
            raise ImportFailed(f"{what}: a blob of the manifest has no size")
    return [config, *layers]


class LayoutWriter:
    """A new OCI layout folder holding one image; blobs go in verified or not at all."""

    def __init__(self, folder: Path, reuse: Callable[[str], Path | None] = lambda d: None):
        self.folder, self.reuse = folder, reuse
        (folder / "blobs/sha256").mkdir(parents=True)
        (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}\n')

    def path(self, digest: str) -> Path:
        return self.folder / "blobs/sha256" / check_digest(digest).split(":")[1]

    def has(self, descriptor: dict) -> bool:
        """Whether the blob is here already, or linked in from one kept elsewhere."""
        target = self.path(descriptor["digest"])
        if target.is_file():
            return True
        found = self.reuse(descriptor["digest"])
        if found is None or found.stat().st_size != descriptor["size"]:
            return False
        if "sha256:" + file_sha256(found) != descriptor["digest"]:
            return False  # e.g. a layout imported by path, copied unchecked
        try:
            os.link(found, target)
        except OSError:
            shutil.copyfile(found, target)
        return True

    def put(self, descriptor: dict, stream: BinaryIO, what: str) -> None:
        """Copy a blob from `stream`, refusing it unless its size and digest match."""
        target = self.path(descriptor["digest"])
        partial = target.with_name(target.name + ".partial")
        sha, size, limit = hashlib.sha256(), 0, descriptor["size"]
        try:
            with open(partial, "wb") as out:
                while chunk := stream.read(min(CHUNK, limit + 1 - size)):
                    sha.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                    if size > limit:
                        break
        except BaseException:  # a broken stream or a full disk: no partial blob stays
            partial.unlink(missing_ok=True)
            raise
        actual = "sha256:" + sha.hexdigest()
        if size != limit or actual != descriptor["digest"]:
            partial.unlink()
            got = f"more than {limit} bytes" if size > limit else f"{size} bytes, {actual}"
            raise ImportFailed(f"{what}: blob {descriptor['digest']} does not match its "
                               f"digest (expected {limit} bytes, got {got})")
        partial.rename(target)

    def put_bytes(self, data: bytes, digest: str) -> None:
        self.path(digest).write_bytes(data)

    def finish(self, manifest: bytes, kind: str, ref: str) -> None:
        """index.json naming the one image (its manifest blob was put before)."""
        entry = {"mediaType": kind, "size": len(manifest),
                 "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
                 "annotations": {REF_NAME: ref}}
        self.put_bytes(manifest, entry["digest"])
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
        (self.folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def split_layout_source(text: str) -> tuple[Path, str | None]:
    """`DIR[:TAG]` of an `oci:` source: the part after the last colon is a tag unless the
    whole text names a folder."""
    folder, sep, tag = text.rpartition(":")
    if not sep or Path(text).is_dir() or not folder:
        return Path(text), None
    return Path(folder), tag


def copy_layout(source: str, target: LayoutWriter) -> str:
    """Copy the linux/amd64 image tagged TAG (or the only one) of `oci:DIR[:TAG]`;
    returns the manifest's digest."""
    folder, tag = split_layout_source(source)
    what = f"oci:{source}"
    if not (folder / "index.json").is_file():
        raise InvalidInput(f"{what}: {folder} is not an OCI layout (no index.json)")
    index = verify_document((folder / "index.json").read_bytes(), None, what)
    entry = _tagged(index, tag, what)
    for _ in range(4):  # an index may name an index
        data = _read_blob(folder, entry, what)
        doc = verify_document(data, entry.get("digest"), what)
        kind = media_type(doc, entry.get("mediaType"))
        if kind not in INDEXES:
            break
        entry = pick_platform(doc, what)
    for blob in check_manifest(doc, kind, what):
        if not target.has(blob):
            with open(_blob_file(folder, blob, what), "rb") as stream:
                target.put(blob, stream, what)
    target.finish(data, kind, tag or "latest")
    return entry["digest"]


def _tagged(index: dict, tag: str | None, what: str) -> dict:
    listed = index.get("manifests")
    entries = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []
    if tag is not None:
        named = [e for e in entries if isinstance(e.get("annotations"), dict)
                 and e["annotations"].get(REF_NAME) == tag]
        if not named:
            raise ImageRefNotFound(f"{what}: the layout has no image tagged {tag!r}")
        entries = named
    if len(entries) == 1:
        return entries[0]
    if not entries:
        raise ImportFailed(f"{what}: index.json lists no manifests")
    return pick_platform({"manifests": entries}, what)


def _blob_file(folder: Path, descriptor: dict, what: str) -> Path:
    path = folder / "blobs/sha256" / check_digest(descriptor.get("digest")).split(":")[1]
    if not path.is_file():
        raise ImportFailed(f"{what}: blob {descriptor['digest']} is missing from the layout")
    return path


def _read_blob(folder: Path, descriptor: dict, what: str) -> bytes:
    path = _blob_file(folder, descriptor, what)
    if path.stat().st_size > MAX_MANIFEST:
        raise ImportFailed(f"{what}: the manifest is larger than {MAX_MANIFEST >> 20} MiB")
    return path.read_bytes()
