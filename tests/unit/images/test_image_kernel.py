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


def module_elf(depends: str) -> bytes:
    """A minimal 64-bit ELF whose .modinfo section says `depends=...`."""
    import struct

    modinfo = f"license=GPL\0depends={depends}\0".encode()
    names = b"\0.modinfo\0.shstrtab\0"
    data_at, names_at = 64, 64 + len(modinfo)
    shoff = names_at + len(names)
    head = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 2)
    sections = b"".join(struct.pack("<IIQQQQ", *fields) + b"\0" * 24 for fields in (
        (0, 0, 0, 0, 0, 0), (1, 1, 0, 0, data_at, len(modinfo)),
        (10, 3, 0, 0, names_at, len(names))))
    return bytes(head) + modinfo + names + sections


def test_compressed_modules_are_read_as_their_elf(tmp_path):
    """Debian 13 ships .ko.xz, others .ko.zst or .ko.gz: dependencies are read from the
    ELF inside, and module_bytes gives the ELF insmod loads."""
    import gzip
    import lzma

    import zstandard

    from provisiond.images.kernel import module_bytes, scan_modules

    moddir = tmp_path / "6.12.0-test"
    (moddir / "kernel").mkdir(parents=True)
    elfs = {"squashfs": module_elf("zstd_dec"), "zstd_dec": module_elf(""),
            "loop": module_elf(""), "overlay": module_elf("")}
    (moddir / "kernel/squashfs.ko.xz").write_bytes(lzma.compress(elfs["squashfs"]))
    (moddir / "kernel/zstd_dec.ko.zst").write_bytes(
        zstandard.ZstdCompressor().compress(elfs["zstd_dec"]))
    (moddir / "kernel/loop.ko.gz").write_bytes(gzip.compress(elfs["loop"]))
    (moddir / "kernel/overlay.ko").write_bytes(elfs["overlay"])
    index = scan_modules(moddir)
    assert index["modules"]["squashfs"]["depends"] == ["zstd_dec"]
    for name, elf in elfs.items():
        assert module_bytes(moddir / index["modules"][name]["path"]) == elf
