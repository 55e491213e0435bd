"""`provisiond serve --tftp` over a root of our own, with real clients: names stay inside the
root (symlinks too), a FIFO cannot stall the server, and block numbers roll over past 65535."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from provisiond.config import write_default_config
from servers import free_port, start_serve, stop_serve, write_config
from tftp_flood import ATFTP, tftp_get, wait_until_served

SECRET = b"root:outside the tftp root\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(port, root) of a serve whose root holds files, links in and out, a FIFO."""
    base = tmp_path_factory.mktemp("tftproot")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (root / "sub").mkdir()
    (root / "sub" / "small.bin").write_bytes(b"small file\n")
    (root / "roll.bin").write_bytes(os.urandom(600_000))  # > 65535 blocks of 8 bytes
    (root / "in.link").symlink_to("sub/small.bin")
    (root / "out.link").symlink_to(outside / "secret")
    (root / "outdir").symlink_to(outside)
    os.mkfifo(root / "fifo")
    state = base / "state"
    write_default_config(state)
    port = free_port(socket.SOCK_DGRAM)
    write_config(state, tftp={"enabled": True, "bind": "127.0.0.1", "port": port,
                              "root": str(root)})
    proc = start_serve(state, "--no-http", "--tftp")
    try:
        wait_until_served(port, "sub/small.bin", b"small file\n", base / "probe")
        yield port, root
    finally:
        stop_serve(proc)


@pytest.mark.parametrize("name", ["out.link", "outdir/secret"])
def test_a_symlink_out_of_the_root_is_refused(served, tmp_path, name):
    port, _ = served
    out = tmp_path / "out"
    output = tftp_get(port, name, out)
    assert "Error code 2" in output
    assert not out.exists() or SECRET not in out.read_bytes()


def test_a_symlink_inside_the_root_is_served(served, tmp_path):
    port, _ = served
    out = tmp_path / "out"
    tftp_get(port, "in.link", out)
    assert out.read_bytes() == b"small file\n"


def test_a_fifo_is_not_found_and_does_not_stall_the_server(served, tmp_path):
    port, _ = served
    assert "Error code 1" in tftp_get(port, "fifo", tmp_path / "fifo")
    wait_until_served(port, "sub/small.bin", b"small file\n", tmp_path / "out")


@pytest.mark.parametrize("options", [[], ["--option", "windowsize 16"]])
def test_block_numbers_roll_over(served, tmp_path, options):
    """blksize 8: 75,001 blocks, so block numbers wrap to 0 (as tftpd-hpa's do)."""
    port, root = served
    out = tmp_path / "out"
    result = subprocess.run([ATFTP, "--option", "blksize 8", *options, "-g", "-r", "roll.bin",
                             "-l", str(out), "127.0.0.1", str(port)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == (root / "roll.bin").read_bytes()


def test_ipv6_loopback_with_real_clients(tmp_path):
    """Bound to ::1: tftp-hpa's client (-6) and curl get the file."""
    state = tmp_path / "state"
    write_default_config(state)
    port = free_port(socket.SOCK_DGRAM)
    write_config(state, tftp={"enabled": True, "bind": "::1", "port": port})
    proc = start_serve(state, "--no-http", "--tftp")
    expected = open("/usr/lib/ipxe/undionly.kpxe", "rb").read()
    try:
        commands = f"binary\nrexmt 1\ntimeout 10\nget undionly.kpxe {tmp_path / 'hpa'}\nquit\n"
        deadline = time.monotonic() + 30
        while not (tmp_path / "hpa").exists() or (tmp_path / "hpa").read_bytes() != expected:
            assert proc.poll() is None and time.monotonic() < deadline, "no answer on ::1"
            subprocess.run(["/usr/bin/tftp", "-6", "::1", str(port)], input=commands,
                           capture_output=True, text=True, timeout=30)
        result = subprocess.run(["curl", "-sS", "-o", str(tmp_path / "curl"),
                                 f"tftp://[::1]:{port}/undionly.kpxe"], capture_output=True)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "curl").read_bytes() == expected
    finally:
        stop_serve(proc)
