"""Module selection without depmod: dependency closure and modules.dep order."""

from __future__ import annotations

import pytest

from provisiond.images.kernel import is_kernel_file, select_modules, write_modules_dep

INDEX = {"version": "6.1.0-test", "builtin": ["af_packet"], "modules": {
    "virtio_net": {"path": "kernel/net/virtio_net.ko",
                   "depends": ["virtio_ring", "virtio", "net_failover"]},
    "virtio": {"path": "kernel/virtio/virtio.ko", "depends": ["virtio_ring"]},
    "virtio_ring": {"path": "kernel/virtio/virtio_ring.ko", "depends": []},
    "net_failover": {"path": "kernel/net/net_failover.ko", "depends": ["failover"]},
    "failover": {"path": "kernel/core/failover.ko", "depends": []},
    "e1000": {"path": "kernel/e1000.ko", "depends": []},
}}


def test_closure_includes_dependencies_and_skips_builtins():
    chosen = select_modules(INDEX, ["virtio-net", "af_packet"])
    assert set(chosen) == {"virtio_net", "virtio", "virtio_ring", "net_failover", "failover"}


def test_unknown_module_is_a_key_error():
    with pytest.raises(KeyError):
        select_modules(INDEX, ["nosuch"])


def test_modules_dep_lists_deepest_dependencies_last(tmp_path):
    chosen = select_modules(INDEX, ["virtio_net"])
    write_modules_dep(tmp_path, INDEX, chosen)
    lines = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "")
                 for line in (tmp_path / "modules.dep").read_text().splitlines())
    deps = lines["kernel/net/virtio_net.ko"].split()
    # modprobe loads from the end: a module's own dependencies must come after it
    assert deps.index("kernel/virtio/virtio.ko") < deps.index("kernel/virtio/virtio_ring.ko")
    assert deps.index("kernel/net/net_failover.ko") < deps.index("kernel/core/failover.ko")


def test_kernel_files_stay_out_of_layers():
    assert is_kernel_file("boot/vmlinuz-6.1.0-56-amd64")
    assert is_kernel_file("boot/initrd.img-6.1.0-56-amd64")
    assert not is_kernel_file("boot/config-6.1.0-56-amd64")
