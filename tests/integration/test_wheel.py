"""The wheel as an administrator installs it: built from an sdist of this tree, installed
into a fresh venv in a temp dir away from the source tree, then `init`, `image build tiny`,
`overlay build` and `serve` from it, and a node's boot fetched over HTTP.

The fresh venv gets provisiond from the wheel only; its dependencies come from this
interpreter's site-packages through a .pth file (a test sends nothing off the machine, and
PyPI is not loopback). That .pth adds the directory without running the .pth files in it,
so this checkout's editable install of provisiond stays out of reach, which the test checks.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

from provisiond import archive
from tests.tools import private_deb_cache

# Builds a wheel, downloads Debian packages (the tiny image) and mounts overlayfs (root).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SKIP = ("/.venv", "/.git", "/build", "/dist", ".egg-info", "__pycache__", "/bench/results",
        "/.lab", "/.pytest_cache")
MAC = "52:54:00:aa:00:01"


def _ignore(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if f"{folder}/{n}".removeprefix(str(REPO)).endswith(SKIP)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """{'bin': the fresh venv's bin dir, 'env': its environment, 'home': a dir outside the
    tree}: the wheel built and installed there."""
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv = root / "src", root / "dist", root / "venv"
    shutil.copytree(REPO, source, ignore=_ignore, symlinks=True)
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(dist), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next(dist.glob("provisiond-*-py3-none-any.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                          "--no-index", "--no-deps", "-q", str(wheel)], capture_output=True,
                         text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
    (Path(purelib.stdout.strip()) / "provisiond_test_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    shutil.rmtree(source)  # nothing may come from the copy of the tree either
    home = root / "home"
    home.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
           "LANG": "C.UTF-8", "PROVISIOND_STATE_DIR": str(home / "state"),
           "PROVISIOND_CACHE_DIR": str(private_deb_cache(root / "cache"))}
    return {"bin": venv / "bin", "env": env, "home": home, "venv": venv}


def run(installed, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(installed["bin"] / "provisiond"), *args], env=installed["env"],
                          cwd=installed["home"], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"provisiond {' '.join(args)}: {proc.stderr}"
    return proc


def test_the_installed_package_is_the_wheel_not_this_tree(installed):
    code = "import provisiond.config as c; print(c.__file__); print(c.SHIPPED_DIR)"
    out = subprocess.run([str(installed["bin"] / "python"), "-c", code], env=installed["env"],
                         cwd=installed["home"], capture_output=True, text=True, check=True)
    module, shipped = out.stdout.split()
    assert module.startswith(str(installed["venv"])), module
    assert shipped.startswith(str(installed["venv"])) and Path(shipped).is_dir()


def test_init_image_build_overlay_build_and_serve_from_the_wheel(installed):
    init = run(installed, "init")
    assert "imported profiles: compute, default, gpu, service" in init.stdout
    overlays = json.loads(run(installed, "overlay", "list", "--json").stdout)
    assert {"init", "agent", "network", "ssh"} <= {o["name"] for o in overlays}
    run(installed, "image", "build", "tiny", timeout=900)
    run(installed, "node", "add", "n1", "--profile", "default", "--image", "tiny",
        "--netdev", "eth0", "--mac", MAC, "--ipaddr", "127.0.0.2")
    run(installed, "overlay", "build")
    port = _free_port()
    (installed["home"] / "state" / "provisiond.yaml").write_text(
        f"http: {{bind: 127.0.0.1, port: {port}, workers: 1}}\n")
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen([str(installed["bin"] / "provisiond"), "serve"],
                             env=installed["env"], cwd=installed["home"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        script = _wait_text(f"{base}/boot/ipxe/{MAC}", serve)
        urls = re.findall(r"http://\S+/(?:blobs|overlays)/\S+", script)
        assert any("/blobs/" in u for u in urls) and any("/overlays/n1/" in u for u in urls)
        bodies = {url: _fetch(url) for url in urls}
        shared = [body for url, body in bodies.items() if url.endswith("/shared")]
        modes = {e.path: e.mode for e in archive.unpack(archive.decompress(shared[0]))}
        assert modes["init"] == 0o100755, oct(modes["init"])  # exec bits survive the wheel
    finally:
        serve.terminate()
        _, err = serve.communicate(timeout=30)
    assert serve.returncode == 0, err.decode(errors="replace")[-2000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.read()


def _wait_text(url: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            return _fetch(url).decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

