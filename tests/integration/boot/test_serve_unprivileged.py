"""`provisiond serve` as the systemd unit runs it (tests/service_sandbox.py: an unprivileged
uid, the unit's capabilities only, its read-only file system) on the privileged ports of a
loopback address: DHCP 67, TFTP 69, DNS 53, HTTP 80, answered by real clients; what it
cannot write; and the same serve without the capability failing in one line."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from bootdata import add_image, add_nodes, ip_of, mac_of
from provisiond.cli.ownership import hand_back
from provisiond.config import load_config, write_default_config
from servers import stop_serve, write_config
from tests.service_sandbox import (UNIT, argv_of, descendants, effective_capabilities,
                                   process_uid, sandbox_argv, service_python)
from tests.tools import command

UID = 64123  # no passwd entry needed: the unit's `provisiond` stands for any such user
CAP_NET_BIND_SERVICE = 10

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setpriv, bwrap)")


@pytest.fixture(scope="module")
def home():
    """A 0755 dir outside pytest's 0700 tmp: the state dir and the service's interpreter."""
    folder = Path(tempfile.mkdtemp(prefix="provisiond-unprivileged-", dir="/var/tmp"))
    folder.chmod(0o755)
    python = service_python(folder)
    yield folder, python
    shutil.rmtree(folder, ignore_errors=True)


def _state(folder: Path, address: str) -> Path:
    state = folder / f"state-{address}"
    write_default_config(state)
    write_config(state, server={"address": address, "domain": "cluster"},
                 http={"bind": address, "port": 80, "workers": 1},
                 dhcp={"enabled": True, "bind": address, "port": 67},
                 tftp={"enabled": True, "bind": address, "port": 69},
                 dns={"enabled": True, "bind": address, "port": 53})
    config = load_config(state)
    add_nodes(config, 3)
    add_image(config, "tiny")
    hand_back(state, UID, UID)
    return state


def _serve(python: Path, folder: Path, state: Path, unit_text: str | None = None,
           log: Path | None = None) -> subprocess.Popen:
    argv = [*sandbox_argv(UID, UID, [state], [folder / "venv"], unit_text), str(python),
            "-m", "provisiond", "--state-dir", str(state), "serve"]
    out = open(log or folder / "serve.log", "wb")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd="/",
                            start_new_session=True)


def _address() -> str:
    """A loopback address of its own, so no other test's serve holds its ports."""
    return f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.1"


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.read()
        except OSError:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)


def test_serve_answers_on_privileged_ports_with_only_the_units_capability(home):
    folder, python = home
    address = _address()
    state = _state(folder, address)
    log = folder / "serve-ok.log"
    proc = _serve(python, folder, state, log=log)
    try:
        script = _wait_http(f"http://{address}/boot/ipxe/{mac_of(2)}", proc, log)
        assert b"provisiond.node=n2" in script
        serve_pid = _serve_pid(proc)
        for pid in [serve_pid, *descendants(serve_pid)]:  # serve, gunicorn, its workers
            assert process_uid(pid) == UID
            assert effective_capabilities(pid) == 1 << CAP_NET_BIND_SERVICE, pid
            assert "NoNewPrivs:\t1" in Path(f"/proc/{pid}/status").read_text()
        tftp = subprocess.run(command(["curl", "-sS", "-o", "-",
                                       f"tftp://{address}:69/undionly.kpxe"]),
                              capture_output=True, timeout=30)
        assert tftp.stdout == Path("/usr/lib/ipxe/undionly.kpxe").read_bytes()
        dig = subprocess.run(command(["dig", "+short", "+time=2", "+tries=2", "-p", "53",
                                      f"@{address}", "n3.cluster"]), capture_output=True,
                             text=True, timeout=30)
        assert dig.stdout.split() == [ip_of(3)], dig
        assert _status_written(state, "n2"), "serve could not record the ipxe phase"
    finally:
        assert _stop(proc) == 0, log.read_text()[-2000:]


def test_the_service_cannot_write_outside_its_state_dir(home):
    """In the unit's sandbox, as its user: the state dir takes a file; /etc, /usr, /var/lib,
    the state dir's parent, /root and the host's /tmp do not."""
    folder, python = home
    state = _state(folder, _address())
    probe = ("import sys\nfrom pathlib import Path\nout = {}\nfor d in sys.argv[1:]:\n"
             "    try:\n        (Path(d) / 'provisiond-probe').write_text('x')\n"
             "        out[d] = 'written'\n    except OSError as e:\n"
             "        out[d] = e.strerror\nprint(repr(out))\n")
    host_tmp = Path(tempfile.mkdtemp(prefix="provisiond-hosttmp-", dir="/tmp"))
    host_tmp.chmod(0o777)
    try:
        targets = [str(state), "/etc", "/usr/local/lib", "/var/lib", str(folder), "/root",
                   str(host_tmp)]
        done = subprocess.run([*sandbox_argv(UID, UID, [state], [folder / "venv"]),
                               str(python), "-c", probe, *targets], capture_output=True,
                              text=True, timeout=60, cwd="/")
        results = eval(done.stdout)  # noqa: S307 - our own probe's repr of a dict of strings
        assert results.pop(str(state)) == "written", done
        assert "written" not in results.values(), results
        assert not list(host_tmp.iterdir())  # its /tmp is private
    finally:
        shutil.rmtree(host_tmp)


def test_without_the_capability_serve_fails_in_one_line(home):
    """The test above can fail: the same serve without CAP_NET_BIND_SERVICE cannot open
    its first privileged port (HTTP's 80) and says so in one line, before anything starts."""
    folder, python = home
    address = _address()
    state = _state(folder, address)
    text = UNIT.read_text().replace("=CAP_NET_BIND_SERVICE", "=")
    log = folder / "serve-nocap.log"
    proc = _serve(python, folder, state, text, log=log)
    assert proc.wait(60) == 8
    lines = log.read_text().strip().splitlines()
    assert lines == [f"provisiond: error: cannot start http on {address}:80: Permission "
                     "denied"], lines


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM to serve itself, as systemd sends it (bwrap forwards no signal); bwrap ends
    with serve's exit status."""
    if proc.poll() is None:
        os.kill(_serve_pid(proc), signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        return stop_serve(proc)  # bwrap killed: --die-with-parent takes serve along


def _serve_pid(proc: subprocess.Popen) -> int:
    """The provisiond process under bwrap and setpriv (setpriv execs it: bwrap's child)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in descendants(proc.pid):
            argv = argv_of(pid)
            if b"provisiond" in argv and b"serve" in argv:
                return pid
        time.sleep(0.1)
    raise AssertionError("no provisiond serve process under the sandbox")


def _status_written(state: Path, node: str, timeout: float = 10) -> bool:
    from provisiond.status import read_status

    config = load_config(state)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (read_status(config, node) or {}).get("phase") == "ipxe":
            return True
        time.sleep(0.2)
    return False

