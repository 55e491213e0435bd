"""The systemd unit `init --systemd` writes (checked by systemd-analyze verify), the state
directory given to the service's user, and root's CLI on such a directory: it runs as the
owner, root's own work (image builds) hands back what it wrote, and image builds refuse to
start where they cannot mount and chroot (the unprivileged service)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.service_sandbox import sandbox_argv, service_python
from tests.tools import tool

REPO = Path(__file__).resolve().parents[2]
USER = "daemon"  # in every Debian passwd; the unit's provisiond user need not exist here

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setpriv)")


def provisiond(state: Path, *args: str, user_argv: list[str] = (), python: str = sys.executable,
               timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*user_argv, python, "-m", "provisiond", "--state-dir", str(state),
                           *args], capture_output=True, text=True, timeout=timeout,
                          cwd="/", env=dict(os.environ, PYTHONPATH=str(REPO)))


def owners(state: Path) -> set[int]:
    return {p.lstat().st_uid for p in [state, *state.rglob("*")]}


@pytest.fixture
def shared_tmp():
    """A 0755 dir outside pytest's 0700 tmp, so another user can reach what is in it."""
    folder = Path(tempfile.mkdtemp(prefix="provisiond-service-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_init_systemd_writes_a_unit_systemd_analyze_accepts(tmp_path):
    state, units = tmp_path / "state", tmp_path / "units"
    units.mkdir()
    done = provisiond(state, "init", "--systemd", "--user", USER, "--unit-dir", str(units))
    assert done.returncode == 0, done.stderr
    unit = units / "provisiond.service"
    text = unit.read_text()
    assert f"User={USER}\n" in text and f"ReadWritePaths={state}\n" in text
    assert f"Environment=PROVISIOND_STATE_DIR={state}\n" in text
    assert f"ExecStart={Path(sys.executable).parent / 'provisiond'} serve\n" in text
    verify = subprocess.run([tool("systemd-analyze"), "verify", str(unit)], capture_output=True,
                            text=True, timeout=60, cwd=units)
    assert verify.returncode == 0 and not (verify.stdout + verify.stderr).strip(), verify
    assert owners(state) == {pwd.getpwnam(USER).pw_uid}  # the whole state dir is theirs


def test_systemd_analyze_catches_a_broken_unit(tmp_path):
    """The check above can fail: a typo in an option is reported."""
    done = provisiond(tmp_path / "state", "init", "--systemd", "--user", USER, "--unit-dir",
                      str(tmp_path))
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "provisiond.service"
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strcit"))
    verify = subprocess.run([tool("systemd-analyze"), "verify", str(unit)], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert "strcit" in verify.stderr


def test_init_systemd_without_the_user_writes_nothing_and_says_how(tmp_path):
    done = provisiond(tmp_path / "state", "init", "--systemd", "--user", "no-such-user-x",
                      "--unit-dir", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "useradd --system" in done.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "provisiond.service").exists()


def test_root_cli_on_the_services_state_dir_runs_as_its_owner(shared_tmp):
    state = shared_tmp / "state"
    assert provisiond(state, "init", "--systemd", "--user", USER, "--unit-dir",
                      str(shared_tmp)).returncode == 0
    added = provisiond(state, "node", "add", "n1", "--profile", "default",
                       "--netdev", "eth0", "--mac", "52:54:00:00:00:01")
    assert added.returncode == 0, added.stderr
    assert owners(state) == {pwd.getpwnam(USER).pw_uid}  # inventory.yaml and its lock too
    served = provisiond(state, "serve", timeout=60)
    assert served.returncode == 6 and served.stderr.count("\n") == 1, served.stderr
    assert f"belongs to {USER}" in served.stderr and "systemctl start provisiond" in served.stderr


def test_roots_changes_on_the_services_state_dir_are_audited_as_roots(shared_tmp):
    """Root's CLI becomes the state dir's owner to write; the audit record still names
    root, not the service's user (it did, wherever no LOGNAME or USER named root:
    `env -i`, systemd-run, a bare ssh command)."""
    state = shared_tmp / "state"
    assert provisiond(state, "init", "--systemd", "--user", USER, "--unit-dir",
                      str(shared_tmp)).returncode == 0
    bare_env = ["env", "-u", "LOGNAME", "-u", "USER", "-u", "LNAME", "-u", "USERNAME",
                "-u", "SUDO_USER"]
    assert provisiond(state, "node", "add", "n1", "--profile", "default",
                      user_argv=bare_env).returncode == 0
    listed = provisiond(state, "audit", "--json")
    assert listed.returncode == 0, listed.stderr
    actors = {e["action"]: e["actor"] for e in json.loads(listed.stdout)}
    assert actors["node.create"] == "cli:root", listed.stdout


def test_an_owner_who_cannot_reach_the_state_dir_is_one_clear_line(tmp_path):
    """pytest's tmp dirs are 0700: root gives the state dir inside to a user who then
    cannot enter it; it said only "Permission denied: .../provisiond.yaml"."""
    state = tmp_path / "state"
    assert provisiond(state, "init", "--systemd", "--user", USER, "--unit-dir",
                      str(tmp_path)).returncode == 0
    listed = provisiond(state, "node", "list")
    assert listed.returncode == 6 and listed.stderr.count("\n") == 1, listed.stderr
    assert f"belongs to {USER}, who cannot reach it" in listed.stderr


def test_image_builds_refuse_to_start_without_root(shared_tmp):
    """As the service runs (an unprivileged user with the unit's capabilities), a build or
    an import stops before it writes anything, saying what it needs."""
    state, uid = shared_tmp / "state", 64123
    assert provisiond(state, "init").returncode == 0
    os.chown(state, uid, uid)
    from provisiond.cli.ownership import hand_back

    hand_back(state, uid, uid)
    python = service_python(shared_tmp)
    sandbox = sandbox_argv(uid, uid, [state], [shared_tmp / "venv"])
    before = sorted(p.relative_to(state) for p in state.rglob("*"))
    for args in (["image", "build", "tiny"], ["image", "import", str(REPO), "x"]):
        done = provisiond(state, *args, user_argv=sandbox, python=str(python))
        assert done.returncode == 6 and done.stderr.count("\n") == 1, done.stderr
        assert "needs root" in done.stderr and "CAP_SYS_ADMIN" in done.stderr
    assert sorted(p.relative_to(state) for p in state.rglob("*")) == before


@pytest.mark.slow  # builds the tiny image (Debian packages from the shared download cache)
def test_an_image_build_as_root_hands_back_all_but_the_layer_trees(shared_tmp):
    """The build runs as root (mounts, chroot) on the service's state dir; afterwards its
    manifest, blobs, logs and events belong to the service's user, so serve can read them
    and append to the journal; the layer trees under cache/ stay root's file systems."""
    from tests.tools import private_deb_cache

    state = shared_tmp / "state"
    assert provisiond(state, "init", "--systemd", "--user", USER, "--unit-dir",
                      str(shared_tmp)).returncode == 0
    private_deb_cache(state / "cache")
    built = subprocess.run([sys.executable, "-m", "provisiond", "--state-dir", str(state),
                            "image", "build", "tiny"], capture_output=True, text=True,
                           timeout=900, env=dict(os.environ, PYTHONPATH=str(REPO),
                                                 PROVISIOND_CACHE_DIR=str(state / "cache")))
    assert built.returncode == 0, built.stderr
    uid = pwd.getpwnam(USER).pw_uid
    outside_cache = [p for p in state.rglob("*") if not p.is_relative_to(state / "cache")]
    assert (state / "images" / "tiny" / "manifest.json") in outside_cache
    assert {p.lstat().st_uid for p in outside_cache} == {uid}
    inittabs = list((state / "cache").rglob("etc/inittab"))
    assert inittabs and all(p.lstat().st_uid == 0 for p in inittabs)
