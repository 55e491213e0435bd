"""The shipped debian12 recipe built once from the apt mirror (slow: debootstrap), checked
layer by layer with the real cpio tool; debian12-compute then reuses its layers."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from provisiond.config import load_config, write_default_config
from provisiond.images import blob_path, build_image
from provisiond.images.cpio import MTIME_CLAMP
from tests.shared_images import SHARED_DEB_CACHE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def debian(debian12_built):
    """debian12 built once per session in a fresh state dir (tests/conftest.py); this
    module's own builds take their .debs from the same shared cache."""
    old = os.environ.get("PROVISIOND_CACHE_DIR")
    os.environ["PROVISIOND_CACHE_DIR"] = old or SHARED_DEB_CACHE
    yield debian12_built
    if old is None:
        del os.environ["PROVISIOND_CACHE_DIR"]


def listing(config, layer: dict) -> list[str]:
    """The paths in a layer, as the real cpio tool lists them."""
    data = subprocess.run(["zstd", "-dc", str(blob_path(config, layer["digest"]))],
                          capture_output=True, check=True).stdout
    out = subprocess.run(["cpio", "-t", "--quiet"], input=data, capture_output=True,
                         check=True).stdout
    return out.decode().split("\n")


def test_debian12_layers_kernel_and_init(debian):
    config, manifest = debian
    assert [l["kind"] for l in manifest["layers"]] == ["debootstrap", "run", "copy", "run"]
    assert manifest["init"] == "/lib/systemd/systemd"
    kernel = blob_path(config, manifest["kernel"]["digest"]).read_bytes()
    assert kernel[0x202:0x206] == b"HdrS"
    base, modules = listing(config, manifest["layers"][0]), listing(
        config, manifest["layers"][1])
    assert "usr/lib/systemd/systemd" in base and "usr/sbin/sshd" in base
    assert "lib" in base and "usr/bin/curl" in base
    assert not [p for p in base if p.startswith(("var/lib/apt/lists/", "usr/share/doc/",
                                                  "usr/share/man/", "etc/ssh/ssh_host_"))]
    version = manifest["kernel"]["version"]
    assert f"usr/lib/modules/{version}/modules.dep" in modules
    assert not [p for p in modules if p.startswith(("boot/vmlinuz", "boot/initrd"))]
    assert not [p for p in modules if "/kernel/sound/" in p]
    assert manifest["total_size"] < 120 * 2**20


def test_debian12_rebuild_reuses_layers_and_compute_shares_them(debian):
    config, manifest = debian
    events: list[dict] = []
    build_image(config, "debian12", progress=events.append)
    assert {e["status"] for e in events} == {"cached"}
    events.clear()
    compute = build_image(config, "debian12-compute", progress=events.append)
    # its own layers: packages (ansible-core...), run (Slurm's node side), copy (drop-ins)
    assert [e["status"] for e in events] == ["cached"] * 4 + ["building", "built"] * 3
    assert compute["layers"][:4] == manifest["layers"]
    top = listing(config, compute["layers"][4])
    assert "usr/bin/ansible-pull" in top and "usr/bin/git" in top and "usr/sbin/chronyd" in top
    assert not [p for p in top if p.startswith("var/lib/apt/lists/")]
    slurm = listing(config, compute["layers"][5])
    assert "usr/sbin/slurmd" in slurm and "usr/sbin/munged" in slurm
    assert not [layer for layer in compute["layers"]  # layers are public: no node's key
                if "etc/munge/munge.key" in listing(config, layer)]


def test_two_debian12_builds_give_identical_digests(debian, tmp_path):
    """A second debootstrap and apt run, in a state dir of its own (no layer reused), gives
    the same bytes: mtimes clamped, logs, caches and ids dropped (docs/reproducible-images.md
    says what could still differ). Before drop_volatile, layer 2 differed in
    var/log/alternatives.log, which holds the time of each change."""
    config, manifest = debian
    write_default_config(tmp_path / "second")
    started = time.monotonic()
    second = build_image(load_config(tmp_path / "second"), "debian12")
    print(f"debian12 second full build: {time.monotonic() - started:.1f}s")
    assert [l["key"] for l in second["layers"]] == [l["key"] for l in manifest["layers"]]
    assert [l["digest"] for l in second["layers"]] == [l["digest"] for l in manifest["layers"]]
    assert second["kernel"]["digest"] == manifest["kernel"]["digest"]
    base = config.state_dir / "cache/layers" / manifest["layers"][0]["key"]
    days = {line.split(":")[2] for line in (base / "etc/shadow").read_text().splitlines()}
    assert days == {str(MTIME_CLAMP // 86400)}, "shadow's last change is SOURCE_DATE_EPOCH's day"
