"""`image shell`: a shell (or one command) in a writable copy of a built image; on a clean
exit its changes become one new top layer.

The image's cached layer trees are mounted read-only under an overlayfs upper dir of the
session's own. Exit 0: the upper dir, less the logs and caches package tools leave (as
in a recipe's `run` layer), is written as an OCI layer tarball (`.wh.` whiteouts for
deletions) to `images/<name>/shell/`, listed in `images/<name>/shell.json` as a `tar`
layer after the recipe's, and the image is rebuilt: every other layer is cached, so only
that one is new. Any other exit, a signal or Ctrl-C: the upper dir is thrown away.

One shell at a time per image: a second is refused naming the first's PID (both would
list their layer on the same top, and the later one's rebuild would carry changes made
without seeing the other's). shell.json is changed under its lock, read then written, so
shells of different images and a failed rebuild taking its entry back lose nobody's entry.

From its shell's clean exit to the end of the rebuild the session holds the image's lock:
an `image delete` done during the shell is seen there (the rebuild would bring the image
back), one asked for later waits for the rebuild. So is an image deleted and built (or
imported) again, of another recipe perhaps, or replaced by `image import --force`: its
manifest's generation is not the one the session opened, and the session's layer, made
on another base, is not added to it but kept as a tarball the error names. A rebuild of
the image during the session keeps its generation, and the layer goes on top of it, as
its earlier shell layers do. The saved manifest is the commit: a rebuild that did not
save it (a failure, Ctrl-C) takes the listing's entry back out and keeps the tarball, the
error naming it; an interrupt after the save changes nothing. gc does not wait for a
session: it keeps the layer trees the session's `lowers` file names, and a build does not
make them again while the session is open (it is refused).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from provisiond.atomic import locked, write_atomic
from provisiond.config import Config
from provisiond.errors import (BuildFailed, Conflict, ExitCode, InvalidInput,
                               ProvisiondError)
from provisiond.images import chroot
from provisiond.images.build import build_image
from provisiond.images.cpio import is_whiteout, source_date_epoch, walk_tree
from provisiond.images.blobs import file_sha256
from provisiond.images.layers import claim_session, is_opaque
from provisiond.images.manifests import (gc_lock, generation_of, image_generation,
                                          load_manifest, lock_path, manifest_entry)
from provisiond.images.recipe import read_shell_layers
from provisiond.images.swap import end_swap
from provisiond.images.oci import WH_OPAQUE, WH_PREFIX, XATTR_RECORD, XATTRS_LEFT_OUT
from provisiond.images.steps import drop_volatile, no_services
from provisiond.state.layout import Layout, lock_of
from provisiond.state.models import ShellLayer, ShellLayers

SHELLS = ("/bin/bash", "/bin/sh")
INTERRUPTS = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}  # each raises KeyboardInterrupt


class ShellAborted(ProvisiondError):
    """The shell or command did not exit 0, or the image went meanwhile: the session's
    changes are not kept."""

    exit_code = BuildFailed.exit_code


class ShellInterrupted(ShellAborted):
    """Ctrl-C ended the shell or command."""

    exit_code = ExitCode.INTERRUPTED


class ShellBusy(Conflict):
    """Another `image shell` is running on the image."""

    code = "shell_busy"


def image_shell(config: Config, name: str, command: str | None = None,
                progress=None, keep=None) -> dict | None:
    """Run the session; returns the new manifest, or None when nothing changed.

    `keep(question)`, when given, is asked whether to keep the changes of an interactive
    shell that ended with a non-zero status (`exit` after a failed command gives its
    status); without it, or on a no, they are dropped."""
    if command is not None and not command.strip():
        raise InvalidInput("--command is empty: give a command, or leave --command out for "
                           "an interactive shell")
    chroot.require_build_privileges("an image shell")
    manifest_entry(config, name)  # a bad or unknown name: refused before the lock is made
    with _hangup_interrupts(), _only_shell(config, name), contextlib.ExitStack() as held:
        with _session(config, name) as (opened, lowers, upper, work):
            code = _run(lowers, upper, work, command, name)
            if code == -signal.SIGINT:
                raise ShellInterrupted(f"image {name} unchanged: interrupted (Ctrl-C)")
            drop_volatile(upper)  # as from a recipe's `run` layer: apt's lists, logs...
            _prune_copied_up(upper, lowers)
            changed = any(upper.iterdir())
            if code != 0 and not (changed and command is None and keep and code > 0 and keep(
                    f"the shell ended with status {code}: keep its changes as a new layer "
                    f"of {name}?")):
                how = f"signal {-code}" if code < 0 else f"status {code}"
                raise ShellAborted(f"image {name} unchanged: the shell ended with {how}")
            if not changed:
                return None
            held.enter_context(locked(lock_path(config, name)))  # to the rebuild's end
            end_swap(config, name)  # an import killed outright: undone or finished first
            now = image_generation(config, name)
            if now is None:  # the rebuild would bring it back
                raise ShellAborted(f"image {name} was deleted during the session: its "
                                   "changes are dropped")
            tar = _save_layer(config, name, upper)
            if now != opened:  # kept: the admin's work, made on the image that went
                raise ShellAborted(f"image {name} was replaced during the session (deleted "
                                   "and built or imported again): its changes are not added "
                                   f"to it; they are kept in {tar}")
            # a Ctrl-C as the session is cleared (seconds): seen before the rebuild starts
            held.enter_context(_interrupts_held())
        return _add_layer(config, name, tar, command, progress)


@contextlib.contextmanager
def _hangup_interrupts() -> Iterator[None]:
    """A hangup (a dropped ssh session) ends the session as Ctrl-C does, its mounts undone:
    SIGHUP's default ended this process at once, leaving the chroot's mounts (the host's
    /proc, /sys and terminals among them) in the session folder. In a thread other than the main one, signals are not ours to set."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGHUP, interrupt)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


@contextlib.contextmanager
def _only_shell(config: Config, name: str, pid_wait: float = 2.0) -> Iterator[None]:
    """Hold the image's shell lock, our PID written in it, through the session and the
    rebuild; ShellBusy naming the holder's PID when another shell has it. The lock goes
    with the process however it ends (flock), so a killed shell blocks nobody."""
    path = Layout.of(config).image_shell_lock(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ShellBusy(f"image {name}: another image shell is running on it (PID "
                            f"{_holder(fd, pid_wait)}); try again when it has ended") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _holder(fd: int, wait: float) -> str:
    """The PID the lock's holder wrote (it writes just after taking the lock: wait a
    little for it), or '?'."""
    deadline = time.monotonic() + wait
    while True:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if pid.isdigit() or time.monotonic() > deadline:
            return pid if pid.isdigit() else "?"
        time.sleep(0.05)


@contextlib.contextmanager
def _session(config: Config, name: str) -> Iterator[tuple[str, list[Path], Path, Path]]:
    """The generation of the image opened, its layer trees (top first) and a fresh upper
    and work dir, removed after.
    The trees' keys go in the session's `lowers` file, gc held off until they are there:
    gc keeps what it names (it would take the trees from under the mount), and no longer
    waits for the session to end (`image gc` waited silently while a shell was open).
    They are written under the trees' layer locks and the file stays flocked while the
    session is open: a build that would make one of them again in place (`--no-cache`)
    is refused, naming this shell (it removed them from under the session's mount).
    Called under the image's shell lock: a session folder of the image's found here is a
    killed shell's (SIGKILL, the OOM killer), and is cleared first."""
    layout = Layout.of(config)
    prefix = layout.shell_session(name, "").name
    folder, claim = None, None
    try:
        with locked(gc_lock(config), shared=True), contextlib.ExitStack() as trees:
            manifest = load_manifest(config, name)
            for stale in layout.layers.glob(f"{prefix}*"):
                if "." not in stale.name[len(prefix):]:  # not `shell-a.b.*` of an older name
                    _clear_session(stale)
            keys = [layer["key"] for layer in reversed(manifest["layers"])]
            for key in sorted(set(keys)):  # a build making one again in place ends first
                trees.enter_context(locked(layout.layer_lock(key)))
            lowers = [layout.layer_tree(key) for key in keys]
            missing = [path.name[:12] for path in lowers if not path.is_dir()]
            if missing:
                raise BuildFailed(f"image {name}: cached layer trees are gone "
                                  f"({', '.join(missing)}): run `provisiond image build "
                                  f"{name}` first")
            folder = Path(tempfile.mkdtemp(prefix=prefix, dir=layout.layers))
            write_atomic(folder / "lowers", "".join(f"{key}\n" for key in keys),
                         durable=False)
            claim = claim_session(folder / "lowers")  # builds leave these trees alone
        (folder / "upper").mkdir()
        yield generation_of(manifest), lowers, folder / "upper", folder / "work"
    finally:
        if folder is not None:
            _clear_session(folder)
        if claim is not None:
            os.close(claim)


def _clear_session(folder: Path) -> None:
    """End what still runs in a session's chroot, undo its mounts, remove its folder (in
    that order: removing it with its mounts in place would reach the host's /proc, /sys
    and /dev/pts)."""
    chroot.end_processes_in(folder)
    chroot.unmount_below(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _run(lowers: list[Path], upper: Path, work: Path, command: str | None,
         name: str) -> int:
    """The shell's exit status (negative: the signal that ended it). This process waits
    through Ctrl-C and Ctrl-\\ as system(3) does: the terminal's SIGINT or SIGQUIT ends the
    command, not us (SIGQUIT's default ended us, leaving the session's mounts)."""
    with chroot.overlay(lowers, upper, work / "w", work / "merged") as root, \
            chroot.system_mounts(root), no_services(root):
        shell = next((s for s in SHELLS if os.access(chroot.resolve_in_root(root, s, True),
                                                     os.X_OK)), None)
        if shell is None:
            raise BuildFailed("the image has neither /bin/bash nor /bin/sh")
        argv = ["chroot", str(root), shell] + (["-i"] if command is None else ["-c", command])
        env = {**chroot.chroot_env(), **_session_env(name)}
        previous = {signum: signal.signal(signum, lambda signum, frame: None)
                    for signum in (signal.SIGINT, signal.SIGQUIT)}
        try:
            proc = subprocess.Popen(argv, env=env, cwd="/")
            try:
                return proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                chroot.end_processes_in(root)  # what it left running (`daemon &`)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _session_env(name: str) -> dict[str, str]:
    """The prompt says which image's shell this is (Debian's bash.bashrc sets its own PS1,
    `root@HOST:/# ` as on the host, led by $debian_chroot); no history file (bash wrote
    what the admin typed, a password given to chpasswd too, into /root/.bash_history: the
    layer), none for less; the terminal's TERM."""
    return {"PS1": f"(image shell {name}) # ", "debian_chroot": f"image shell {name}",
            "HISTFILE": "", "LESSHISTFILE": "-", "TERM": os.environ.get("TERM", "dumb")}


def _prune_copied_up(upper: Path, lowers: list[Path]) -> None:
    """Remove the directories overlayfs only copied up (mounting /proc or resolv.conf, or
    a file made and deleted again): empty, not opaque, and in the image with the same
    mode and owner. What is left is what the session changed."""
    for folder, dirs, files in os.walk(upper, topdown=False):
        path = Path(folder)
        if path == upper or files or any(os.path.lexists(path / d) for d in dirs):
            continue
        rel = path.relative_to(upper)
        below = next((lower / rel for lower in lowers if os.path.lexists(lower / rel)), None)
        if below is None or is_opaque(path) or below.is_symlink() or not below.is_dir():
            continue
        mine, theirs = path.lstat(), below.lstat()
        if (mine.st_mode, mine.st_uid, mine.st_gid) == (theirs.st_mode, theirs.st_uid,
                                                         theirs.st_gid):
            path.rmdir()


def _save_layer(config: Config, name: str, upper: Path) -> Path:
    """The upper dir as a layer tarball named by its sha256, beside the image's manifest."""
    folder = Layout.of(config).image_shell_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".layer.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            write_layer(upper, out)
        target = folder / f"{file_sha256(Path(tmp))}.tar"
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_layer(upper: Path, out) -> None:
    """An overlayfs upper dir as an OCI layer tarball, the inverse of oci.apply_layer:
    whiteout devices as `.wh.NAME`, opaque dirs with `.wh..wh..opq`, xattrs (file
    capabilities) as `SCHILY.xattr.NAME` records; sorted, owners by number, mtimes clamped
    as in our layers, so the same changes give the same bytes."""
    clamp = source_date_epoch()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in walk_tree(upper):
            parent, base = os.path.split(rel)
            if is_whiteout(st):
                tar.addfile(_plain(os.path.join(parent, WH_PREFIX + base), clamp))
                continue
            info = tar.gettarinfo(str(upper / rel), rel)
            if info is None:  # a socket: tar has no type for it (docker skips them too)
                continue
            info.uname = info.gname = ""
            info.mtime = min(int(info.mtime), clamp)
            info.pax_headers.update(_xattr_records(upper / rel))
            if info.isreg():
                with open(upper / rel, "rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
            if info.isdir() and is_opaque(upper / rel):
                tar.addfile(_plain(os.path.join(rel, WH_OPAQUE), clamp))


def _xattr_records(path: Path) -> dict[str, str]:
    """The file's xattrs as PAX records (values as tarfile takes bytes), sorted; less
    those no layer carries (oci.XATTRS_LEFT_OUT: overlayfs's own bookkeeping, whose opaque
    mark is the `.wh..wh..opq` entry, and the host's SELinux label)."""
    names = sorted(n for n in os.listxattr(path, follow_symlinks=False)
                   if not n.startswith(XATTRS_LEFT_OUT))
    return {f"{XATTR_RECORD}{n}": os.getxattr(path, n, follow_symlinks=False).decode(
        "utf-8", "surrogateescape") for n in names}


def _plain(name: str, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime, info.mode = mtime, 0o644
    return info


def _add_layer(config: Config, name: str, tar: Path, command: str | None, progress) -> dict:
    """List the tarball as the image's next shell layer and rebuild, under the image's
    lock (the caller's). The saved manifest is the commit: a rebuild that did not save it
    (a failure, Ctrl-C) takes the entry back out, so the image and its listing stay as
    they were, and keeps the tarball, the session's work, which the error names. One that
    saved it is done, an interrupt after the save notwithstanding (taking the entry back
    out then left the listing unlike the manifest). Interrupts are let through during the
    rebuild only, so that no edit of the listing and no rollback is cut half-way."""
    path = f"shell/{tar.name}"
    what = f"image shell: {command}" if command else "image shell (interactive)"
    with _interrupts_held():
        before = manifest_entry(config, name).revision
        listed = False
        try:
            _edit_listing(config, name, lambda entries: [
                *entries, ShellLayer(path=path, description=what[:200])])
            listed = True
            if _take_held():  # Ctrl-C as it was listed: no rebuild
                raise KeyboardInterrupt
            with _interrupts_let_through():
                return build_image(config, name, progress, lock_held=True)
        except BaseException as exc:
            if manifest_entry(config, name).revision != before:  # saved
                if isinstance(exc, KeyboardInterrupt):
                    return load_manifest(config, name)
                raise
            if listed:
                _edit_listing(config, name, lambda entries: _without(entries, path))
            raise _kept(name, tar, exc)


# The interrupts held back (see _interrupts_held): the handlers they had, how deep the holds
# are nested, and those that landed meanwhile.
_HOLD: dict = {"depth": 0, "handlers": {}, "pending": []}


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C, a hangup or SIGTERM landing in the block waits, and is dropped as the
    outermost such block ends: what the block decided stands. (Only those this process
    turns into KeyboardInterrupt: a SIGTERM left to its default still ends it.) Their
    handlers are swapped for one that notes them, not the signals blocked: a blocked
    process-wide signal is delivered to any other thread that has it unblocked, whose
    Python handler then raises in the main thread all the same. Only the main thread sets
    handlers (signals are run there): in another, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _HOLD["depth"] == 0:
        _HOLD["handlers"] = {signum: signal.getsignal(signum) for signum in INTERRUPTS
                             if callable(signal.getsignal(signum))}
        _HOLD["pending"].clear()
        _set_handlers(_note_interrupt)
    _HOLD["depth"] += 1
    try:
        yield
    finally:
        _HOLD["depth"] -= 1
        if _HOLD["depth"] == 0:
            _set_handlers(None)
            _HOLD["pending"].clear()


def _note_interrupt(signum, frame) -> None:
    _HOLD["pending"].append(signum)


def _set_handlers(handler) -> None:
    """The held interrupts' handler: `handler`, or None for the ones they had."""
    for signum, own in _HOLD["handlers"].items():
        signal.signal(signum, handler or own)


@contextlib.contextmanager
def _interrupts_let_through() -> Iterator[None]:
    """Within _interrupts_held: interrupts arrive as usual in the block."""
    if _HOLD["depth"] == 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    _set_handlers(None)
    try:
        yield
    finally:
        _set_handlers(_note_interrupt)


def _take_held() -> bool:
    """Take the interrupts that landed while held (see _interrupts_held); True if one did."""
    taken = bool(_HOLD["pending"])
    _HOLD["pending"].clear()
    return taken


def _kept(name: str, tar: Path, exc: BaseException) -> BaseException:
    """The rebuild's error as one line saying where the session's layer is kept."""
    kept = f"image {name} unchanged; the session's changes are kept in {tar}"
    if isinstance(exc, KeyboardInterrupt):
        return ShellInterrupted(f"interrupted before the rebuild was saved: {kept}")
    if isinstance(exc, OSError):
        text = f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        return ShellAborted(f"{text}; {kept}")
    if isinstance(exc, ProvisiondError):
        return ShellAborted(f"{exc}; {kept}")
    exc.add_note(kept)  # not ours to put in one line: its traceback, with this note
    return exc


def _without(entries: list[ShellLayer], path: str) -> list[ShellLayer]:
    """The entries less the last one listing `path` (the one this session added)."""
    last = max((i for i, e in enumerate(entries) if e.path == path), default=None)
    return [e for i, e in enumerate(entries) if i != last]


def _edit_listing(config: Config, name: str, change) -> list[ShellLayer]:
    """Read-modify-write of the image's shell.json under its lock; the file goes when no
    entry is left. Returns the entries written."""
    listing = Layout.of(config).image_shell_layers(name)
    listing.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_of(listing)):
        entries = change(read_shell_layers(listing, name))
        if entries:
            write_atomic(listing, ShellLayers(entries).text())
        else:
            listing.unlink(missing_ok=True)
    return entries
