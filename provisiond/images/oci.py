"""OCI image layouts and docker-archive tarballs as a base: one of our layers per image
layer, with `.wh.NAME` files turned into overlayfs whiteouts and `.wh..wh..opq` into
opaque directories, so deletions flow into the image's whiteout list like any other."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import zstandard

from provisiond.archive import TRUSTED
from provisiond.errors import BuildFailed
from provisiond.images.blobs import file_sha256, stream_sha256
from provisiond.images.layout import CHUNK, check_digest, pick_platform
from provisiond.images.layers import OPAQUE, LayerPlan, layer_key
from provisiond.images.recipe import Step

WH_PREFIX = ".wh."
WH_OPAQUE = ".wh..wh..opq"
Opener = Callable[[], BinaryIO]


class Archive:
    """Read files from an OCI layout or docker archive, given as a tarball or a folder."""

    def __init__(self, path: Path):
        self.path = path
        self.tar = None if path.is_dir() else tarfile.open(path, "r:*")

    def read(self, name: str) -> bytes:
        with self.open(name) as handle:
            return handle.read()

    def open(self, name: str) -> BinaryIO:
        name = name.removeprefix("./")
        if self.tar is None:
            return open(self.inside(name), "rb")
        for member in (name, "./" + name):  # `tar -C layout -cf x.tar .` names ./index.json
            try:
                handle = self.tar.extractfile(member)
            except KeyError:  # no such member
                continue
            if handle is not None:
                return handle
        raise BuildFailed(f"{self.path.name}: archive has no file {name}")

    def inside(self, name: str) -> Path:
        """`name` in the archive's folder: a name from its manifest (a docker archive's
        Layers, an OCI digest) must not lead out of it, to a host file read as a layer."""
        path = (self.path / name).resolve()
        if not path.is_relative_to(self.path.resolve()):
            raise BuildFailed(f"{self.path.name}: {name!r} is outside the archive")
        return path

    def exists(self, name: str) -> bool:
        name = name.removeprefix("./")
        if self.tar is None:
            return self.inside(name).is_file()
        names = self.tar.getnames()
        return name in names or "./" + name in names


def layer_names(archive: Archive) -> list[tuple[str, str]]:
    """(path in archive, digest) of every image layer, bottom first."""
    if archive.exists("index.json"):
        index = json.loads(archive.read("index.json"))
        manifest = _oci_manifest(archive, index)
        return [(_blob(d["digest"]), d["digest"]) for d in manifest["layers"]]
    if archive.exists("manifest.json"):
        entries = json.loads(archive.read("manifest.json"))
        return [(name, "") for name in entries[0]["Layers"]]
    raise BuildFailed(f"{archive.path.name}: neither an OCI layout (index.json) "
                      f"nor a docker archive (manifest.json)")


def _blob(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


def _oci_manifest(archive: Archive, index: dict) -> dict:
    for _ in range(4):  # an index may point at a nested index
        entry = pick_platform(index, archive.path.name)
        index = json.loads(archive.read(_blob(check_digest(entry.get("digest")))))
        if "layers" in index:
            return index
    raise BuildFailed(f"{archive.path.name}: no image manifest found")


def plan_archive(step: Step, parent: str | None, compression: str) -> list[LayerPlan]:
    """One LayerPlan per image layer, keyed by the layer's content digest."""
    path = (step.folder / step.layer.path).resolve()
    if not path.exists():
        raise BuildFailed(f"{step.where}: missing file {step.layer.path} "
                          f"(looked in {step.folder})")
    try:
        archive = Archive(path)
        names = layer_names(archive)
    except (tarfile.TarError, ValueError, KeyError, IndexError, TypeError,
            AttributeError) as exc:  # JSON of the wrong shape
        raise BuildFailed(f"{step.where}: {path.name} is not a readable OCI or docker "
                          f"archive ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    plans = []
    for number, (name, named) in enumerate(names, 1):
        digest = named or "sha256:" + _digest_member(archive, name)
        key = layer_key(parent, "oci-layer", {"digest": digest}, {}, compression)
        plans.append(LayerPlan(key, step.kind, f"{path.name} layer {number} ({digest[:19]})",
                               _maker(lambda name=name: archive.open(name), name, named or None),
                               mount_parents=False))
        parent = key
    return plans


def _digest_member(archive: Archive, name: str) -> str:
    if archive.tar is None:
        return file_sha256(archive.inside(name))
    with archive.open(name) as handle:
        return stream_sha256(handle)


def plan_tar(step: Step, parent: str | None, compression: str) -> list[LayerPlan]:
    """A `tar` layer (one layer tarball, e.g. an image shell's): keyed by its content."""
    path = step.folder / step.layer.path
    if not path.is_file():
        raise BuildFailed(f"{step.where}: missing file {step.layer.path} "
                          f"(looked in {step.folder})")
    key = layer_key(parent, "tar", {"digest": "sha256:" + file_sha256(path)}, {}, compression)
    description = step.layer.description or f"{step.recipe}#{step.index} tar"
    return [LayerPlan(key, step.kind, description, _maker(lambda: open(path, "rb"), path.name),
                      mount_parents=False)]


def _maker(opener: Opener, name: str, digest: str | None = None):
    """Unpack the layer; with the digest its manifest names (its cache key), check that
    the bytes are that digest's, so a layer is never cached under another one's key."""
    def make(root: Path) -> None:
        try:
            with opener() as blob:
                reader = _Hashing(blob)
                apply_layer(reader, root)
                if digest is not None and reader.digest() != digest:
                    raise BuildFailed(f"{name}: the layer does not match its digest {digest} "
                                      f"(it is {reader.digest()})")
        except (tarfile.TarError, zstandard.ZstdError, EOFError, KeyError) as exc:
            raise BuildFailed(f"{name}: not a readable layer tarball ({exc})") from None
    return make


class _Hashing:
    """A blob read through, hashed on the way; digest() reads what tar left unread."""

    def __init__(self, blob: BinaryIO):
        self.blob, self.sha = blob, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.blob.read(size)
        self.sha.update(data)
        return data

    def digest(self) -> str:
        while self.read(CHUNK):
            pass
        return "sha256:" + self.sha.hexdigest()


def apply_layer(blob: BinaryIO, root: Path) -> None:
    """Unpack one layer tarball (plain, gzip or zstd) into an empty layer tree."""
    stream = _decompressed(blob)
    with tarfile.open(fileobj=stream, mode="r|*") as layer:
        for member in layer:
            rel = os.path.normpath(member.name.lstrip("/"))
            if rel in (".", "..") or rel.startswith("../"):
                continue
            base, parent = os.path.basename(rel), os.path.dirname(rel)
            _check_inside(root, parent, member)
            if base == WH_OPAQUE:
                _mark_opaque(root / parent)
            elif base.startswith(WH_PREFIX):
                _whiteout(root / parent / _whited_out(base, member))
            else:
                _clear(root / rel, member)
                member.name = rel
                linked = _xattrs_of(root / member.linkname) if member.islnk() else {}
                layer.extract(member, root, **TRUSTED)
                _restore_xattrs(root / rel, linked, member)
                _set_xattrs(root / rel, member)


XATTR_RECORD = "SCHILY.xattr."
# not carried into a layer: overlayfs's own bookkeeping (an opaque dir is `.wh..wh..opq`) and
# the building host's SELinux label (the node's policy labels its files)
XATTRS_LEFT_OUT = ("trusted.overlay.", "security.selinux")


def _set_xattrs(path: Path, member: tarfile.TarInfo) -> None:
    """The entry's xattrs from its PAX `SCHILY.xattr.NAME` records (file capabilities such as
    ping's cap_net_raw, user.* attributes), as GNU tar and image shell write them."""
    for key, value in sorted(member.pax_headers.items()):
        name = key[len(XATTR_RECORD):]
        if key.startswith(XATTR_RECORD) and not name.startswith(XATTRS_LEFT_OUT):
            _set_xattr(path, name, value.encode("utf-8", "surrogateescape"), member)


def _set_xattr(path: Path, name: str, value: bytes, member: tarfile.TarInfo) -> None:
    """One xattr of the entry; one the host refuses is one line."""
    try:
        os.setxattr(path, name, value, follow_symlinks=False)
    except OSError as exc:
        raise BuildFailed(f"layer entry {member.name!r}: cannot set its xattr {name}: "
                          f"{exc.strerror}") from None


def _xattrs_of(path: Path) -> dict[str, bytes]:
    try:
        return {name: os.getxattr(path, name, follow_symlinks=False)
                for name in os.listxattr(path, follow_symlinks=False)}
    except OSError:  # no such file (tarfile says so when it extracts the link)
        return {}


def _restore_xattrs(path: Path, before: dict[str, bytes], member: tarfile.TarInfo) -> None:
    """Give a hard link's inode back the xattrs its extraction took: tarfile chowns the link,
    and a chown drops the file's capabilities (security.capability). GNU tar records the
    xattrs on the file's first entry only, not on the hard links to it that follow."""
    for name, value in before.items():
        if name not in os.listxattr(path, follow_symlinks=False):
            _set_xattr(path, name, value, member)


def _check_inside(root: Path, parent: str, member: tarfile.TarInfo) -> None:
    """Refuse entries (files, whiteouts, hard links) that would land in or link to a place
    outside the layer through a symlink, `..` or an absolute path (owners and setuid bits
    are kept, so tarfile's own safe filters do not fit here)."""
    top = os.path.realpath(root)
    places = [os.path.realpath(root / parent)]
    if member.islnk():
        member.linkname = os.path.normpath(member.linkname.lstrip("/"))
        places.append(os.path.realpath(root / member.linkname))
    if not all(p == top or p.startswith(top + "/") for p in places):
        raise BuildFailed(f"layer entry {member.name!r} points outside the image")


def _whited_out(base: str, member: tarfile.TarInfo) -> str:
    """The name a `.wh.NAME` entry deletes; `.wh.`, `.wh..` and `.wh...` name the folder
    itself or its parent (the latter, at the top, the whole layer cache)."""
    name = base[len(WH_PREFIX):]
    if name in ("", ".", ".."):
        raise BuildFailed(f"layer entry {member.name!r} is not a whiteout of a name")
    return name


def _decompressed(blob: BinaryIO) -> BinaryIO:
    head = blob.read(4)
    rest = io.BufferedReader(_Prefixed(head, blob))
    if head == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(rest)
    return rest


class _Prefixed(io.RawIOBase):
    """A stream that yields `head` and then the rest of `tail` (to sniff a magic number)."""

    def __init__(self, head: bytes, tail: BinaryIO):
        self.head, self.tail = head, tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.tail.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _mark_opaque(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.setxattr(folder, OPAQUE, b"y")


def _whiteout(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _clear(path, None)
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))


def _clear(path: Path, member: tarfile.TarInfo | None) -> None:
    """Remove what a later entry replaces (a directory stays if a directory replaces it)."""
    if path.is_dir() and not path.is_symlink():
        if member is None or not member.isdir():
            shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
