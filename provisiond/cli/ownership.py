"""The state directory belongs to the user `provisiond serve` runs as (the systemd unit's
`provisiond`): whatever the CLI writes there must stay readable and writable by that user.

Run by root on a state directory another user owns, the CLI therefore becomes that user
before the verb runs, except for root's own work: image builds and imports (mounts,
chroot), `init --systemd` and `doctor` (which binds privileged ports to test them). Those
run as root and hand what they wrote back to the owner afterwards, except the image layer
trees under cache/, which are root file systems owned as they will be on a node. `serve`
as root there is refused: it belongs to the unit, as the unprivileged owner.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

from provisiond.audit import keep_cli_actor
from provisiond.config import service_paths
from provisiond.errors import Forbidden


def verb_kind(args) -> str:
    """'root' (runs as root, hands back), 'service' (serve) or 'owner' (runs as the owner)."""
    if args.noun in ("image", "doctor") or getattr(args, "systemd", False):
        return "root"
    return "service" if args.noun == "serve" else "owner"


@contextlib.contextmanager
def as_state_owner(state_dir: Path, kind: str) -> Iterator[None]:
    """Run the verb's body as the state directory's owner (see the module's docstring)."""
    owner = _owner(state_dir)
    if os.geteuid() != 0 or owner is None or owner[0] == 0:
        yield
        return
    uid, gid = owner
    if kind == "service":
        raise Forbidden(f"{state_dir} belongs to {_user_name(uid)}: run `provisiond serve` as "
                        "that user (systemctl start provisiond), not as root, so that what it "
                        "writes stays theirs")
    if kind == "owner":
        keep_cli_actor()  # the audit names root, not the owner it runs as
        _become(uid, gid)
        if not os.access(state_dir, os.R_OK | os.W_OK | os.X_OK):
            raise Forbidden(f"{state_dir} belongs to {_user_name(uid)}, who cannot reach it (a "
                            "parent directory is closed to them): open its parents to them, "
                            "or move the state directory")
        yield
        return
    try:
        yield
    finally:
        hand_back(state_dir, uid, gid)


def hand_back(state_dir: Path, uid: int, gid: int) -> int:
    """chown to uid:gid what root owns under the state dir, the layer cache excepted;
    returns how many entries changed. Symlinks themselves are changed, never followed."""
    changed = sum(_chown_if_root(path, uid, gid) for path in service_paths(state_dir))
    return changed + _chown_if_root(str(state_dir), uid, gid)


def _chown_if_root(path: str, uid: int, gid: int) -> int:
    try:
        if os.lstat(path).st_uid != 0:
            return 0
        os.lchown(path, uid, gid)
    except FileNotFoundError:  # removed meanwhile (a lock, a temp file)
        return 0
    return 1


def _owner(state_dir: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(state_dir)
    except OSError:
        return None  # not made yet: `init` makes it, as whoever runs it
    return st.st_uid, st.st_gid


def _become(uid: int, gid: int) -> None:
    """Give up root for good: the owner's groups, gid and uid."""
    try:
        os.initgroups(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:  # no passwd entry: no supplementary groups
        os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
