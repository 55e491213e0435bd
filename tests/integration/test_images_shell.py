"""`image shell NAME --command CMD` on the shipped tiny image (real chroot, overlayfs,
cpio): a clean exit adds exactly one layer, a rebuild reuses every layer, deletions become
whiteouts; a failing command or Ctrl-C keeps the image as it was."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisiond.config import load_config, write_default_config
from provisiond.errors import BuildFailed, ExitCode
from provisiond.images import build as build_module
from provisiond.images import build_image, chroot, load_manifest, shell
from provisiond.images.manifests import image_exists, save_manifest
from tests.integration.test_images import apply_whiteouts, run_cli, unpack
from tests.integration.test_images_oci import KILLED_AT, BOTTOM, layer_tar, oci_archive
from tests.tools import private_deb_cache
from tests.waits import blocked_on_a_lock

pytestmark = pytest.mark.slow  # downloads the tiny image's Debian packages once


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A state dir with tiny built once (its layer trees cached)."""
    cache = private_deb_cache(tmp_path_factory.mktemp("cache"))
    old = os.environ.get("PROVISIOND_CACHE_DIR")
    os.environ["PROVISIOND_CACHE_DIR"] = str(cache)
    state = tmp_path_factory.mktemp("shell") / "state"
    write_default_config(state)
    yield load_config(state)
    os.environ.pop("PROVISIOND_CACHE_DIR")
    if old is not None:
        os.environ["PROVISIOND_CACHE_DIR"] = old


@pytest.fixture
def tiny(built):
    """tiny as its recipe makes it: an earlier test's shell layers dropped, then rebuilt
    (every layer cached)."""
    (built.images_dir / "tiny/shell.json").unlink(missing_ok=True)
    shutil.rmtree(built.images_dir / "tiny/shell", ignore_errors=True)
    return built, build_image(built, "tiny")


def digests(manifest: dict) -> list[str]:
    return [layer["digest"] for layer in manifest["layers"]]


def left_behind(config) -> list[str]:
    """Session folders under the layer cache, and mounts anywhere in the state dir."""
    sessions = [p.name for p in (config.state_dir / "cache/layers").glob("shell-*")]
    with open("/proc/self/mountinfo") as handle:
        mounts = [line.split()[4] for line in handle
                  if line.split()[4].startswith(str(config.state_dir))]
    return sessions + mounts


def test_a_clean_command_adds_exactly_one_layer_and_a_rebuild_reuses_all(tiny, tmp_path):
    config, before = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command", "touch /etc/marker")
    assert code == 0, output
    after = load_manifest(config, "tiny")
    assert digests(after)[:-1] == digests(before) and len(after["layers"]) == 3
    assert after["layers"][-1]["kind"] == "tar"
    assert after["layers"][-1]["description"] == "image shell: touch /etc/marker"
    events: list[dict] = []
    rebuilt = build_image(config, "tiny", progress=events.append)
    assert [e["status"] for e in events] == ["cached"] * 3
    assert digests(rebuilt) == digests(after)
    root = unpack(config, after, tmp_path / "root")
    assert (root / "etc/marker").is_file()
    tar = next((config.images_dir / "tiny/shell").glob("*.tar"))
    with tarfile.open(tar) as layer:
        assert layer.getnames() == ["etc", "etc/marker"]
    assert left_behind(config) == []


def test_deletions_become_whiteouts(tiny, tmp_path):
    config, before = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command",
                           "rm /etc/hostname && rm -r /usr/share/udhcpc && echo x > /etc/new")
    assert code == 0, output
    after = load_manifest(config, "tiny")
    assert digests(after)[:-1] == digests(before)
    tar = next((config.images_dir / "tiny/shell").glob("*.tar"))
    with tarfile.open(tar) as layer:
        assert sorted(layer.getnames()) == ["etc", "etc/.wh.hostname", "etc/new", "usr",
                                            "usr/share", "usr/share/.wh.udhcpc"]
    root = unpack(config, after, tmp_path / "root")
    assert apply_whiteouts(root) == ["/etc/hostname", "/usr/share/udhcpc"]
    assert not (root / "etc/hostname").exists() and (root / "etc/new").read_text() == "x\n"
    assert (root / "etc/passwd").is_file()


def test_package_tool_logs_and_caches_stay_out_of_the_layer(tiny):
    """`apt-get install` in the session put apt's lists and caches, its logs and dpkg's
    into the layer (tens of MB in every node's RAM, and a different digest every time),
    where a recipe's `run` or `packages` layer drops them (steps.drop_volatile)."""
    config, before = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command", " && ".join([
        "mkdir -p /var/log/apt /var/lib/apt/lists /var/cache/apt/archives",
        "echo when > /var/log/apt/history.log", "echo when > /var/log/dpkg.log",
        "echo list > /var/lib/apt/lists/deb.debian.org_Packages",
        "echo deb > /var/cache/apt/archives/htop.deb", "echo 1234 > /etc/machine-id",
        "touch /etc/marker"]))
    assert code == 0, output
    tar = next((config.images_dir / "tiny/shell").glob("*.tar"))
    with tarfile.open(tar) as layer:
        files = {m.name: m.size for m in layer.getmembers() if m.isfile()}
    assert files == {"etc/marker": 0, "etc/machine-id": 0}


def test_no_change_adds_no_layer(tiny):
    config, before = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command", "cat /etc/hostname")
    assert code == 0 and "nothing changed, no layer added" in output, output
    assert load_manifest(config, "tiny") == before
    assert not (config.images_dir / "tiny/shell.json").exists()


def test_the_sessions_dev_is_its_own_not_the_hosts(tiny):
    """The chroot's /dev was the host's, bound in: what a session (or a package's script)
    made or removed there, it made or removed on the host (`rm /dev/null`). It is a tmpfs of
    its own now, with the usual devices and the host's terminals (/dev/pts)."""
    config, before = tiny
    marker = Path("/dev/pvtest-shell-marker")
    marker.unlink(missing_ok=True)
    try:
        code, output = run_cli(config, "image", "shell", "tiny", "--command", " && ".join([
            "touch /dev/pvtest-shell-marker", "echo x > /dev/null",
            "head -c 4 /dev/urandom | wc -c > /etc/random-bytes", "test -c /dev/tty",
            "test -d /dev/pts && test -L /dev/fd"]))
        made_on_host = marker.exists()
    finally:
        marker.unlink(missing_ok=True)
    assert code == 0, output
    assert not made_on_host
    tar = next((config.images_dir / "tiny/shell").glob("*.tar"))
    with tarfile.open(tar) as layer:
        assert layer.getnames() == ["etc", "etc/random-bytes"]
        assert layer.extractfile("etc/random-bytes").read().strip() == b"4"
    assert left_behind(config) == []


def test_a_failing_command_keeps_the_image_as_it_was(tiny):
    config, before = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command",
                           "touch /etc/marker; exit 3")
    lines = [l for l in output.splitlines() if l.startswith("provisiond: error")]
    assert code == BuildFailed.exit_code and len(lines) == 1, output
    assert "image tiny unchanged: the shell ended with status 3" in lines[0]
    assert load_manifest(config, "tiny") == before
    assert not (config.images_dir / "tiny/shell").exists()
    assert left_behind(config) == []


def test_ctrl_c_keeps_the_image_as_it_was(tiny):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it."""
    config, before = tiny
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", "tiny", "--command", "touch /etc/marker; echo started; sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "started\n"  # the command runs: Ctrl-C now
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert err.strip().splitlines()[-1] == (
        "provisiond: error: image tiny unchanged: interrupted (Ctrl-C)")
    assert load_manifest(config, "tiny") == before
    assert not (config.images_dir / "tiny/shell").exists()
    assert left_behind(config) == []


def test_ctrl_backslash_is_the_command_s_not_provisiond_s(tiny):
    """Ctrl-\\ (SIGQUIT to the whole process group, as a terminal sends it) ended provisiond
    at once (SIGQUIT's default), leaving the session's mounts (the host's /proc, /sys and
    terminals among them) and its command running. provisiond waits through it as it does
    through Ctrl-C (system(3) ignores both): the command decides (tiny's sh ignores it)."""
    config, before = tiny
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", "tiny", "--command", "touch /etc/marker; echo started; read -t 300 line"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        assert proc.stdout.readline() == "started\n"
        os.killpg(proc.pid, signal.SIGQUIT)
        time.sleep(1)
        assert proc.poll() is None, proc.communicate()
        out, err = proc.communicate("go\n", timeout=300)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        clear_sessions(config)
    after = load_manifest(config, "tiny")
    assert digests(after)[:-1] == digests(before) and after["layers"][-1]["kind"] == "tar"
    assert left_behind(config) == []


def clear_sessions(config) -> None:
    """What a test's failure left: processes rooted in a session, its mounts, its folder."""
    for folder in (config.state_dir / "cache/layers").glob("shell-*"):
        chroot.end_processes_in(folder)
        chroot.unmount_below(folder)
        shutil.rmtree(folder, ignore_errors=True)


def sleep_token() -> str:
    """An argument for this test's own `sleep` (found by it in /proc)."""
    return str(87000 + os.getpid() % 400)


def start_shell(config, command: str) -> subprocess.Popen:
    """`image shell tiny --command CMD` in a session of its own (as from a terminal that
    can go away), once CMD has printed `started` (then it sleeps for sleep_token())."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", "tiny", "--command", f"{command}; echo started; sleep {sleep_token()}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "started\n"
    return proc


def test_a_dropped_terminal_keeps_the_image_and_leaves_no_mount(tiny):
    """SIGHUP to the process group, as a dropped ssh session sends it: its default ended
    provisiond at once, leaving the overlay, /proc, /sys, the host's /dev and resolv.conf
    mounted in the session folder (an `rm -r` of it would have reached the host's /dev)."""
    config, before = tiny
    proc = start_shell(config, "touch /etc/marker")
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == ExitCode.INTERRUPTED, err
        assert load_manifest(config, "tiny") == before
        assert not (config.images_dir / "tiny/shell").exists()
        assert left_behind(config) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        clear_sessions(config)


def test_a_killed_shell_s_session_is_cleared_by_the_next(tiny):
    """SIGKILL (the OOM killer, kill -9) leaves the session's mounts and its command
    running in them: the next shell on the image clears them (it holds the image's shell
    lock, so no live shell owns them) and ends the processes still rooted there."""
    config, before = tiny
    proc = start_shell(config, "touch /etc/first")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert left_behind(config) != []  # what this test is about
        code, output = run_cli(config, "image", "shell", "tiny", "--command",
                               "touch /etc/marker")
        assert code == 0, output
        assert left_behind(config) == []
        assert _running(sleep_token()) == []
        tar = next((config.images_dir / "tiny/shell").glob("*.tar"))
        with tarfile.open(tar) as layer:
            assert layer.getnames() == ["etc", "etc/marker"]
    finally:
        clear_sessions(config)
        for pid in _running(sleep_token()):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


def with_bash(config) -> str:
    """tinybash: tiny with the host's bash and the libraries it loads (the shell `image
    shell` prefers) and Debian's bash.bashrc prompt, built on tiny's cached layers."""
    recipe = config.state_dir / "recipes/tinybash"
    files = recipe / "files"
    shutil.rmtree(recipe, ignore_errors=True)
    ldd = subprocess.run(["/usr/bin/ldd", "/bin/bash"], capture_output=True, text=True,
                         check=True).stdout
    needed = ["/bin/bash"] + [word for line in ldd.splitlines() for word in line.split()
                              if word.startswith("/")]
    for path in needed:
        (files / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, files / path.lstrip("/"))
    (files / "etc").mkdir(exist_ok=True)  # Debian's prompt, as its /etc/bash.bashrc sets it
    (files / "etc/bash.bashrc").write_text(
        "[ -z \"$PS1\" ] && return\nPS1='${debian_chroot:+($debian_chroot)}\\u@\\h:\\w\\$ '\n")
    (recipe / "image.yaml").write_text(
        "description: tiny with bash\nlayers:\n  - {kind: image, name: tiny}\n"
        "  - kind: copy\n    files:\n      - {src: files, dest: /}\n")
    (config.images_dir / "tinybash/shell.json").unlink(missing_ok=True)
    shutil.rmtree(config.images_dir / "tinybash/shell", ignore_errors=True)
    build_image(config, "tinybash")
    return "tinybash"


def test_an_interactive_bash_leaves_no_history_in_the_image(tiny):
    """An interactive bash wrote what the admin typed (a password given to chpasswd too)
    to /root/.bash_history as it exited: every session added a layer holding it, and
    `nothing changed` was never said after one."""
    config, _ = tiny
    name = with_bash(config)
    before = load_manifest(config, name)
    proc = subprocess.run(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", name], input="echo typed-by-the-admin\nexit 0\n",
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "typed-by-the-admin" in proc.stdout, proc.stdout  # bash ran it
    assert f"{name}: nothing changed, no layer added" in proc.stdout, proc.stdout
    assert load_manifest(config, name) == before


def test_a_debian_bash_prompt_says_it_is_the_image_shell(tiny):
    """Debian's /etc/bash.bashrc sets PS1 over ours: the session's prompt was
    `root@HOST:/# `, the host's own root prompt. debian_chroot is what it shows first."""
    config, _ = tiny
    name = with_bash(config)
    proc = subprocess.run(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", name], input="exit 0\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"(image shell {name})root@" in proc.stderr, proc.stderr


def test_an_empty_command_is_refused_not_an_interactive_shell(tiny):
    """`--command "$CMD"` with CMD empty (a script's unset variable) ran an interactive
    shell instead, reading commands from the script's stdin, and kept what they did."""
    config, before = tiny
    proc = subprocess.run(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", "tiny", "--command", ""], input="touch /etc/from-stdin\nexit 0\n",
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.INVALID_INPUT, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "provisiond: error: --command is empty: give a command, or leave --command out "
        "for an interactive shell"], proc.stderr
    assert load_manifest(config, "tiny") == before


def test_an_image_deleted_during_the_session_stays_deleted(tiny):
    """`image delete` while a shell ran on the image: the shell's clean exit listed its
    layer and rebuilt the image from its recipe, so the deleted image came back."""
    config, _ = tiny
    with held_shell(config, "tiny", "marker") as first:
        code, output = run_cli(config, "image", "delete", "tiny")
        assert code == 0, output
        out, err = first.communicate("go\n", timeout=300)
    assert first.returncode == BuildFailed.exit_code, out + err
    assert err.strip().splitlines()[-1] == (
        "provisiond: error: image tiny was deleted during the session: its changes are "
        "dropped"), err
    assert not image_exists(config, "tiny")
    assert not (config.images_dir / "tiny").exists()
    assert left_behind(config) == []


# tiny's first layer alone (cached): another recipe of the name, whose image has no
# /etc/inittab, /etc/init.d/rcS...
TINY_BASE = """description: tiny's busybox layer alone
layers:
  - kind: busybox
    package: busybox-static
    kernel: linux-image-amd64
    modules: [virtio_net, virtio_pci, virtio_blk, e1000, af_packet, loop, squashfs, overlay]
"""


@pytest.mark.parametrize("recipe", ["the same recipe", "another recipe"])
def test_an_image_deleted_and_built_again_during_the_session_gets_no_layer(tiny, recipe):
    """`image delete` then `image build` of the name while a shell ran on it: the shell's
    clean exit saw an image of that name and added its layer, made on the deleted image,
    to the new one (on another base, of another recipe). It adds nothing now: the new
    image stays as built, and the session's work is kept in a tarball the one line names."""
    config, _ = tiny
    site = config.state_dir / "recipes/tiny"  # shadows the shipped recipe
    try:
        with held_shell(config, "tiny", "marker") as first:
            code, output = run_cli(config, "image", "delete", "tiny")
            assert code == 0, output
            if recipe == "another recipe":
                site.mkdir(parents=True)
                (site / "image.yaml").write_text(TINY_BASE)
            rebuilt = build_image(config, "tiny")
            out, err = first.communicate("go\n", timeout=300)
    finally:
        shutil.rmtree(site, ignore_errors=True)
    assert first.returncode == BuildFailed.exit_code, out + err
    tars = list((config.images_dir / "tiny/shell").glob("*.tar"))
    assert len(tars) == 1, err
    assert err.strip().splitlines()[-1] == (
        "provisiond: error: image tiny was replaced during the session (deleted and built or "
        f"imported again): its changes are not added to it; they are kept in {tars[0]}"), err
    with tarfile.open(tars[0]) as layer:
        assert layer.getnames() == ["etc", "etc/marker"]
    assert load_manifest(config, "tiny") == rebuilt
    assert not (config.images_dir / "tiny/shell.json").exists()
    assert left_behind(config) == []


def test_an_import_with_force_during_the_session_replaces_the_image_it_opened(
        tiny, tmp_path):
    """`image import --force` over the image is a delete and an import: the session's
    exit adds nothing to the imported image and keeps its tarball, as after a delete and
    a build."""
    config, _ = tiny
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    try:
        with held_shell(config, "tiny", "marker") as first:
            code, output = run_cli(config, "image", "import", str(archive), "tiny", "--force")
            assert code == 0, output
            imported = load_manifest(config, "tiny")
            out, err = first.communicate("go\n", timeout=300)
    finally:
        shutil.rmtree(config.state_dir / "recipes/tiny", ignore_errors=True)
    assert first.returncode == BuildFailed.exit_code, out + err
    tars = list((config.images_dir / "tiny/shell").glob("*.tar"))
    assert len(tars) == 1 and f"they are kept in {tars[0]}" in err, err
    assert load_manifest(config, "tiny") == imported
    assert [layer["kind"] for layer in imported["layers"]] == ["oci-archive"]
    assert left_behind(config) == []


@pytest.mark.parametrize("meanwhile", ["rebuilt", "deleted and built again"])
def test_a_session_on_an_image_built_before_generations(tiny, meanwhile):
    """A manifest written before generations (a site upgraded) has none. The first build
    after the upgrade gave it one, so a shell open on it across that plain rebuild was
    refused, its line saying the image had been deleted and built again, which nobody
    had done. A rebuild keeps the generation it finds, none too: the layer goes on top;
    a delete and a build still make another image, which gets no layer."""
    config, before = tiny
    save_manifest(config, {k: v for k, v in before.items() if k != "generation"})
    try:
        with held_shell(config, "tiny", "marker") as first:
            if meanwhile != "rebuilt":
                code, output = run_cli(config, "image", "delete", "tiny")
                assert code == 0, output
            rebuilt = build_image(config, "tiny")
            out, err = first.communicate("go\n", timeout=300)
        after = load_manifest(config, "tiny")
        if meanwhile == "rebuilt":
            assert first.returncode == 0, out + err
            assert digests(after)[:-1] == digests(before)
            assert after["layers"][-1]["kind"] == "tar"
        else:
            assert first.returncode == BuildFailed.exit_code, out + err
            assert "image tiny was replaced during the session" in err, err
            assert after == rebuilt and rebuilt["generation"] != ""
        assert left_behind(config) == []
    finally:  # the next tests' tiny has a generation again
        run_cli(config, "image", "delete", "tiny")
        build_image(config, "tiny")


def test_an_import_killed_during_the_session_is_undone_before_its_layer_goes_on(
        tiny, tmp_path):
    """`image import --force` over the image killed outright (SIGKILL) while a shell ran
    on it: the session's rebuild made the killed import's unbuilt recipe, under the shell
    layers of the image it was to replace, and with that image's generation. The shell's
    exit ends the swap first now: the image it opened, with the session's layer on top."""
    config, before = tiny
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(BOTTOM)])
    folders = [config.state_dir / "recipes" / name for name in (
        "tiny", ".tiny.import", ".tiny.previous", ".tiny.failed")]
    try:
        with held_shell(config, "tiny", "marker") as first:
            run = subprocess.run([sys.executable, "-c", KILLED_AT, "before the save",
                                  "--state-dir", str(config.state_dir), "image", "import",
                                  str(archive), "tiny", "--force"],
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == -signal.SIGKILL, run.stderr
            out, err = first.communicate("go\n", timeout=300)
        left = [p.name for p in folders if p.exists()]
    finally:  # the shipped recipe of tiny for the next tests
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    assert first.returncode == 0, out + err
    after = load_manifest(config, "tiny")
    assert digests(after)[:-1] == digests(before) and after["layers"][-1]["kind"] == "tar"
    assert after["generation"] == before["generation"]
    assert left == []  # the killed import's recipe folder gone: tiny's shipped one again
    assert left_behind(config) == []


def test_a_rebuild_during_the_session_keeps_the_image_and_takes_the_layer(tiny):
    """`image build` of the image while a shell is open on it is a rebuild of the same
    image (its generation kept): the session's layer goes on top, as before."""
    config, before = tiny
    with held_shell(config, "tiny", "marker") as first:
        rebuilt = build_image(config, "tiny")
        assert rebuilt["generation"] == before["generation"] != ""
        out, err = first.communicate("go\n", timeout=300)
    assert first.returncode == 0, out + err
    after = load_manifest(config, "tiny")
    assert digests(after)[:-1] == digests(before) and after["layers"][-1]["kind"] == "tar"
    assert after["generation"] == before["generation"]
    assert left_behind(config) == []


def read_until(fd: int, text: str, seen: bytearray, seconds: float = 120) -> None:
    """Read the terminal's output into `seen` until it holds `text`, bounded."""
    deadline = time.monotonic() + seconds
    while text.encode() not in seen:
        assert time.monotonic() < deadline, f"no {text!r} in {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the terminal's other end closed: provisiond ended
                assert text.encode() in seen, f"no {text!r} in {bytes(seen)!r}"


@pytest.mark.parametrize("answer", ["y", "n"])
def test_an_interactive_shell_left_with_a_failed_status_asks(tiny, answer):
    """`exit` (or Ctrl-D) after a command that failed ends an interactive shell with that
    command's status: the whole session's work was thrown away without a word of warning.
    On a terminal, provisiond now asks whether to keep it."""
    config, before = tiny
    main_fd, other = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", "tiny"], stdin=other, stdout=other, stderr=other, start_new_session=True)
    os.close(other)
    seen = bytearray()
    try:
        read_until(main_fd, "(image shell tiny) # ", seen)
        os.write(main_fd, b"touch /etc/kept; false\n")
        os.write(main_fd, b"exit\n")
        read_until(main_fd, "[y/N] ", seen)
        os.write(main_fd, f"{answer}\n".encode())
        assert proc.wait(timeout=120) == (0 if answer == "y" else BuildFailed.exit_code), seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    assert b"the shell ended with status 1: keep its changes as a new layer of tiny?" in seen
    if answer == "y":
        tar = next((config.images_dir / "tiny/shell").glob("*.tar"))
        with tarfile.open(tar) as layer:
            assert layer.getnames() == ["etc", "etc/kept"]
    else:
        assert load_manifest(config, "tiny") == before
    assert left_behind(config) == []


def test_an_image_not_built_is_one_line(tiny):
    config, _ = tiny
    code, output = run_cli(config, "image", "shell", "nothere", "--command", "true")
    assert code == ExitCode.NOT_FOUND and output.count("\n") == 1, output
    assert "no image named 'nothere' has been built" in output


def _running(token: str) -> list[int]:
    """PIDs of processes whose command line holds `token` (this test's own sleep)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if token.encode() in handle.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.parametrize("status", [0, 4])
def test_a_process_the_session_left_running_is_ended(tiny, status):
    """`daemon &` in the session: it outlived the shell in a chroot whose mounts were only
    lazily detached, and wrote on while the layer was packed."""
    config, before = tiny
    token = str(86000 + os.getpid() % 400 + status)  # this test's own `sleep` argument
    try:
        code, output = run_cli(config, "image", "shell", "tiny", "--command",
                               f"sleep {token} >/dev/null 2>&1 & touch /etc/marker; "
                               f"exit {status}")
        assert code == (0 if status == 0 else BuildFailed.exit_code), output
        assert _running(token) == []
        assert left_behind(config) == []
    finally:
        for pid in _running(token):
            os.kill(pid, signal.SIGKILL)


def built_on_tiny(config, name: str) -> None:
    """Another image built of tiny's layers alone (its recipe: one `image` layer), with no
    shell layers of an earlier test's."""
    (config.state_dir / f"recipes/{name}").mkdir(parents=True, exist_ok=True)
    (config.state_dir / f"recipes/{name}/image.yaml").write_text(
        "description: tiny again\nlayers:\n  - {kind: image, name: tiny}\n")
    (config.images_dir / f"{name}/shell.json").unlink(missing_ok=True)
    build_image(config, name)


@contextlib.contextmanager
def held_shell(config, image: str, marker: str,
               then: str = "") -> Iterator[subprocess.Popen]:
    """`image shell IMAGE --command` that touches /etc/MARKER, waits for a line on its
    stdin, then runs THEN; entered once the marker is in the session's upper dir. A shell
    still running on the way out gets EOF (its `read` fails, so it unmounts its session: a
    kill would leave the mounts) and is waited for."""
    command = f"touch /etc/{marker} && read -t 300 line" + (f" && {then}" if then else "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", image, "--command", command],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        layers = config.state_dir / "cache/layers"
        wait_for(lambda: any(layers.glob(f"shell-{image}.*/upper/etc/{marker}")),
                 f"the shell on {image}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=120)


def wait_for(condition, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_two_shells_on_one_image_the_second_refused_other_images_go_on(tiny):
    """Real processes: a shell held open on tiny (its command waits on stdin); a second on
    tiny is refused in one line naming the first's PID (both ran, and each listed its
    layer on the same top); a shell on another image meanwhile adds its layer; the first
    then ends cleanly, and a shell on tiny after it adds a second layer: every entry kept."""
    config, _ = tiny
    built_on_tiny(config, "tiny2")
    first = subprocess.Popen(
        [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir), "image",
         "shell", "tiny", "--command", "touch /etc/first && read -t 300 line"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        layers = config.state_dir / "cache/layers"
        wait_for(lambda: any(layers.glob("shell-tiny.*/upper/etc/first")), "the first shell")
        code, output = run_cli(config, "image", "shell", "tiny", "--command", "touch /x")
        assert code == ExitCode.CONFLICT, output
        assert output.strip().splitlines() == [
            f"provisiond: error: image tiny: another image shell is running on it (PID {first.pid}); "
            "try again when it has ended"], output
        code, output = run_cli(config, "image", "shell", "tiny2", "--command", "touch /y")
        assert code == 0, output
        first.stdin.write(b"go\n")
        first.stdin.close()
        assert first.wait(timeout=300) == 0, first.stdout.read().decode()
    finally:  # a failure above: end the first shell as its own failure (its `read` gets
        # EOF) so it unmounts its session; a kill leaves the mounts behind
        if not first.stdin.closed:
            first.stdin.close()
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
        first.stdout.close()
    code, output = run_cli(config, "image", "shell", "tiny", "--command", "touch /etc/later")
    assert code == 0, output
    listed = json.loads((config.images_dir / "tiny/shell.json").read_text())
    assert [e["description"] for e in listed] == [
        "image shell: touch /etc/first && read -t 300 line", "image shell: touch /etc/later"]
    assert [e["description"] for e in json.loads(
        (config.images_dir / "tiny2/shell.json").read_text())] == ["image shell: touch /y"]
    assert [layer["kind"] for layer in load_manifest(config, "tiny")["layers"]][-2:] == [
        "tar", "tar"]


def test_gc_does_not_wait_for_an_open_shell_and_keeps_its_layer_trees(tiny):
    """`image gc` waited, silently, for as long as a shell was open (the session held the
    gc lock to keep the layer trees it mounts). gc runs now, and keeps those trees even
    when no image references them any more (the image deleted during the session)."""
    config, _ = tiny
    recipe = config.state_dir / "recipes/tinygc"
    (recipe / "files").mkdir(parents=True, exist_ok=True)
    (recipe / "files/gc-marker").write_text(f"{os.getpid()}\n")
    (recipe / "image.yaml").write_text(
        "description: tiny and a file\nlayers:\n  - {kind: image, name: tiny}\n"
        "  - kind: copy\n    files:\n      - {src: files/gc-marker, dest: /etc/gc-marker}\n")
    top = build_image(config, "tinygc")["layers"][-1]["key"]
    tree = config.state_dir / "cache/layers" / top
    with held_shell(config, "tinygc", "first") as first:
        code, output = run_cli(config, "image", "delete", "tinygc")
        assert code == 0, output
        gc = subprocess.run(
            [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir),
             "image", "gc", "--json"], capture_output=True, text=True, timeout=60)
        assert gc.returncode == 0, gc.stderr
        assert tree.is_dir() and (tree / "etc/gc-marker").is_file()
        out, err = first.communicate("go\n", timeout=300)
    assert first.returncode == BuildFailed.exit_code, out + err
    assert "image tinygc was deleted during the session" in err, err
    assert left_behind(config) == []
    code, output = run_cli(config, "image", "gc")
    assert code == 0 and not tree.exists(), output


def test_a_delete_as_the_session_saves_its_layer_waits_and_the_image_stays_deleted(
        tiny, monkeypatch):
    """`image delete` landing after the shell's exit, as its layer was saved (after the
    check that the image was still there): the rebuild brought the deleted image back.
    The session holds the image's lock from there to the end of its rebuild now: the
    delete waits for it, then deletes."""
    config, _ = tiny
    deleting = []
    real = shell._save_layer

    def save_layer(*args):
        proc = subprocess.Popen(
            [sys.executable, "-m", "provisiond", "--state-dir", str(config.state_dir),
             "image", "delete", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        deleting.append(proc)
        wait_for(lambda: proc.poll() is not None or blocked_on_a_lock(proc.pid),
                 "the delete to end or wait", 60)
        return real(*args)

    monkeypatch.setattr(shell, "_save_layer", save_layer)
    try:
        code, output = run_cli(config, "image", "shell", "tiny", "--command",
                               "touch /etc/marker")
        out, _ = deleting[0].communicate(timeout=120)
    finally:
        for proc in deleting:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert deleting[0].returncode == 0, out
    assert code == 0, output  # the session was done before the delete
    assert not image_exists(config, "tiny")
    assert not (config.images_dir / "tiny").exists()
    assert left_behind(config) == []


def test_an_interrupt_after_the_manifest_is_saved_leaves_the_listing_in_step(
        tiny, monkeypatch):
    """Ctrl-C landing between the save of the rebuilt manifest and the end of the rebuild
    took the layer's entry back out of shell.json: the image had the layer, the listing
    not, and the next build dropped it. The save is the commit: the session is done."""
    config, before = tiny
    real = build_module.save_manifest

    def save_then_interrupt(*args):
        real(*args)
        os.kill(os.getpid(), signal.SIGINT)  # a KeyboardInterrupt before the build ends

    monkeypatch.setattr(build_module, "save_manifest", save_then_interrupt)
    code, output = run_cli(config, "image", "shell", "tiny", "--command",
                           "touch /etc/marker")
    monkeypatch.undo()
    after = load_manifest(config, "tiny")
    listed = json.loads((config.images_dir / "tiny/shell.json").read_text()) if (
        config.images_dir / "tiny/shell.json").exists() else []
    assert len(after["layers"]) == len(before["layers"]) + 1, output
    assert [e["description"] for e in listed] == ["image shell: touch /etc/marker"], output
    assert code == 0, output
    assert digests(build_image(config, "tiny")) == digests(after)  # the layer stays on top
    assert left_behind(config) == []


def test_a_failed_rebuild_keeps_the_session_s_layer_and_says_where(tiny):
    """The shell exited 0 but the rebuild failed (here: the session removed the kernel):
    the session's tarball, its work, was deleted with the listing's entry. It is kept,
    listed nowhere, and the one error line names it; the image stays as it was."""
    config, before = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command",
                           "rm /boot/vmlinuz-*")
    lines = [l for l in output.splitlines() if l.startswith("provisiond: error")]
    assert code == BuildFailed.exit_code and len(lines) == 1, output
    tars = list((config.images_dir / "tiny/shell").glob("*.tar"))
    assert len(tars) == 1, output
    assert lines[0] == (
        "provisiond: error: recipe tiny: the image has no /boot/vmlinuz-*; image tiny "
        f"unchanged; the session's changes are kept in {tars[0]}")
    with tarfile.open(tars[0]) as layer:
        assert any(name.startswith("boot/.wh.vmlinuz-") for name in layer.getnames())
    assert not (config.images_dir / "tiny/shell.json").exists()
    assert load_manifest(config, "tiny") == before
    assert left_behind(config) == []


def test_gc_shows_a_failed_session_s_tarball_and_removes_it_only_when_asked(tiny):
    """The tarball a failed rebuild kept, listed nowhere, was shown by nothing (`image gc`
    neither): such tarballs piled up. gc shows it now and keeps it; --shell-tarballs
    removes it, and never a tarball the image lists."""
    config, _ = tiny
    code, output = run_cli(config, "image", "shell", "tiny", "--command",
                           "rm /boot/vmlinuz-*")
    assert code == BuildFailed.exit_code, output
    [failed] = (config.images_dir / "tiny/shell").glob("*.tar")
    code, output = run_cli(config, "image", "shell", "tiny", "--command", "touch /etc/m")
    assert code == 0, output
    [listed] = set((config.images_dir / "tiny/shell").glob("*.tar")) - {failed}
    code, output = run_cli(config, "image", "gc")
    assert code == 0, output
    assert f"  {failed}  " in output and str(listed) not in output, output
    assert "kept 1 `image shell` layer tarball(s) no image lists" in output, output
    assert failed.is_file()
    code, output = run_cli(config, "image", "gc", "--shell-tarballs")
    assert code == 0 and "removed 1 `image shell` layer tarball(s)" in output, output
    assert not failed.exists() and listed.is_file()
    code, output = run_cli(config, "image", "build", "tiny")
    assert code == 0, output
    assert load_manifest(config, "tiny")["layers"][-1]["description"] == (
        "image shell: touch /etc/m")


def test_an_interrupt_as_the_session_is_cleared_keeps_the_layer_and_says_where(
        tiny, monkeypatch):
    """Ctrl-C after the shell exited 0 and its layer was saved, as the session's mounts
    and upper dir were removed (seconds for a large session): the tarball was left listed
    nowhere, and the error said only `interrupted`. It is seen before the rebuild now."""
    config, before = tiny
    real = shell._clear_session

    def clear_then_interrupt(folder):
        real(folder)
        if any((config.images_dir / "tiny/shell").glob("*.tar")):  # the layer was saved
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(shell, "_clear_session", clear_then_interrupt)
    code, output = run_cli(config, "image", "shell", "tiny", "--command",
                           "touch /etc/marker")
    tars = list((config.images_dir / "tiny/shell").glob("*.tar"))
    assert code == ExitCode.INTERRUPTED and len(tars) == 1, output
    assert output.splitlines()[-1] == (
        "provisiond: error: interrupted before the rebuild was saved: image tiny unchanged; "
        f"the session's changes are kept in {tars[0]}"), output
    assert not (config.images_dir / "tiny/shell.json").exists()
    assert load_manifest(config, "tiny") == before
    assert left_behind(config) == []


def test_a_build_without_the_cache_is_refused_while_a_shell_mounts_the_layer_trees(tiny):
    """`image build --no-cache` of the image, or of another one sharing its layers, while
    a shell on it was open removed the layer trees the session had mounted and built them
    again: the session's view lost its files (its busybox among them). Refused now, in
    one line naming the shell's PID; the session goes on and adds its layer."""
    config, before = tiny
    built_on_tiny(config, "tiny3")
    with held_shell(config, "tiny", "first",
                    then="/bin/busybox true && cat /etc/passwd") as first:
        for name in ("tiny", "tiny3"):
            code, output = run_cli(config, "image", "build", "--no-cache", name)
            assert code == ExitCode.CONFLICT, output
            assert output.strip().splitlines() == [
                f"provisiond: error: image {name}: layer 1 (busybox): the image shell on "
                f"tiny (PID {first.pid}) has its layer tree mounted: try again when that "
                "shell has ended"], output
        out, err = first.communicate("go\n", timeout=300)
    assert first.returncode == 0, out + err
    assert "root:" in out
    after = load_manifest(config, "tiny")
    assert digests(after)[:-1] == digests(before) and after["layers"][-1]["kind"] == "tar"
    assert left_behind(config) == []
