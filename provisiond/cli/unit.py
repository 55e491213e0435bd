"""The systemd unit `init --systemd` writes: the shipped provisiond.service with this
installation's provisiond, state directory and user filled in."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import sys
from pathlib import Path

from provisiond.atomic import write_atomic
from provisiond.config import CONTROL_RE, SHIPPED_DIR
from provisiond.errors import Forbidden, InvalidInput

SHIPPED_UNIT = SHIPPED_DIR / "systemd" / "provisiond.service"
UNIT_DIR = Path("/etc/systemd/system")
UNIT_NAME = "provisiond.service"


def service_user(name: str) -> tuple[int, int, str]:
    """(uid, gid, group name) of the user the unit runs as; a missing one says how to add it."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise InvalidInput(f"no user {name!r} to run the service as: add one with `useradd "
                           f"--system --user-group --home-dir /var/lib/provisiond --no-create-home "
                           f"--shell /usr/sbin/nologin {name}`, or name another with --user") from None
    if entry.pw_uid == 0:
        raise InvalidInput(f"--user {name}: the service must not run as root")
    return entry.pw_uid, entry.pw_gid, grp.getgrgid(entry.pw_gid).gr_name


def exec_start() -> str:
    """The command line of the installed provisiond: its console script beside this
    interpreter, else this interpreter with -m."""
    script = shutil.which("provisiond", path=str(Path(sys.executable).parent))
    words = [script] if script else [sys.executable, "-m", "provisiond"]
    return " ".join(words + ["serve"])


def render_unit(state_dir: Path, user: str, group: str, command: str) -> str:
    """The shipped unit with the lines init sets replaced."""
    for value in (str(state_dir), user, group, command):
        if CONTROL_RE.search(value) or (value != command and " " in value):
            raise InvalidInput(f"{value!r}: a unit file line cannot hold it (blanks or "
                               "control characters)")
    values = {"User": user, "Group": group, "ReadWritePaths": str(state_dir),
              "Environment": f"PROVISIOND_STATE_DIR={state_dir}", "ExecStart": command}
    text = SHIPPED_UNIT.read_text()
    for key, value in values.items():
        text, count = re.subn(rf"^{key}=.*$", lambda _: f"{key}={value}", text, count=1,
                              flags=re.M)
        assert count == 1, key  # the shipped unit holds each line once
    return text


def unit_text(state_dir: Path, user: str) -> str:
    """The unit for `user` (who must exist), checked before anything is written."""
    if os.geteuid() != 0:
        raise Forbidden("init --systemd needs root: it writes the unit and gives the state "
                        "directory to the service's user")
    _, _, group = service_user(user)
    return render_unit(state_dir, user, group, exec_start())


def write_unit(text: str, unit_dir: Path = UNIT_DIR) -> Path:
    path = Path(unit_dir) / UNIT_NAME
    write_atomic(path, text, mode=0o644)
    return path
