"""A layer's file or link over a lower layer's directory: which paths the builder packs
again for the node's /init (replaced_dirs), how they are packed (pack_tree copies), and
which of them the image's top layer lists (replacement_list). The node's side, with the
real kernel unpacking the layers and the real /init: tests/integration/
test_mounted_layers_boot.py (both boots must show the same root)."""

from __future__ import annotations

import io
import os
import socket
import subprocess

import pytest

from provisiond.errors import BuildFailed
from provisiond.images.cpio import pack_tree, walk_tree
from provisiond.images.layers import replaced_dirs, replacement_list


def make(root, dirs=(), files=(), links=()):
    for rel in dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{rel}\n")
    for rel, target in links:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)
    return root


def test_a_file_link_or_fifo_over_a_lower_directory_is_found(tmp_path):
    host = make(tmp_path / "host", dirs=["x"])  # what a lower tree's symlink points to
    lower = make(tmp_path / "lower", dirs=["opt/empty", "srv"],
                 files=["opt/link/a", "opt/file/a", "opt/fifo/a", "opt/same", "opt/gone/a"],
                 links=[("alias", str(host))])
    deeper = make(tmp_path / "deeper", files=["usr/lib/a"])  # deleted between, still there
    upper = make(tmp_path / "upper", dirs=["alias", "srv"],
                 files=["opt/file", "opt/same", "opt/empty", "alias/x", "usr/lib"],
                 links=[("opt/link", "/srv/x")])
    os.mkfifo(upper / "opt/fifo")
    os.mknod(upper / "opt/gone", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    found = replaced_dirs(upper, [deeper, lower])
    # an empty directory the kernel would replace counts too (/init finds it done);
    # alias/x is a directory only through the lower tree's symlink, out of that tree
    assert found == ["opt/empty", "opt/fifo", "opt/file", "opt/link", "usr/lib"]
    assert replaced_dirs(upper, []) == []


def test_a_socket_over_a_lower_directory_is_not_listed(tmp_path):
    """A socket left in a layer (a daemon a step ran) is packed nowhere (cpio carries none),
    its side copy neither: listed, /init found nothing to move and stopped the boot."""
    lower = make(tmp_path / "lower", files=["run/app/a"])
    upper = make(tmp_path / "upper", dirs=["run"])
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(upper / "run/app"))
    listener.close()
    assert replaced_dirs(upper, [lower]) == []


def test_the_replacing_entries_are_packed_again_under_their_side_path(tmp_path):
    upper = make(tmp_path / "upper", files=["opt/file"], links=[("opt/link", "/srv/x")])
    os.chmod(upper / "opt/file", 0o640)
    out = io.BytesIO()
    side = ".provisiond/replacements.d/003"
    count = pack_tree(upper, out, {".provisiond/replacements": b"003/opt/link\n"},
                      copies={f"{side}/opt/file": "opt/file", f"{side}/opt/link": "opt/link"})
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=out.getvalue(),
                             capture_output=True, check=True).stdout.decode().split()
    assert listing == ["opt", "opt/file", "opt/link", ".provisiond",
                       ".provisiond/replacements.d", side, f"{side}/opt",
                       f"{side}/opt/file", f"{side}/opt/link", ".provisiond/replacements"]
    assert count == len(listing)
    dest = tmp_path / "dest"
    dest.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=out.getvalue(), cwd=dest, check=True)
    assert (dest / side / "opt/file").read_text() == "opt/file\n"
    assert (dest / side / "opt/file").stat().st_mode & 0o777 == 0o640
    assert os.readlink(dest / side / "opt/link") == "/srv/x"


def view(root, **tree) -> dict:
    """A merged view's walk, as final_lists hands it over."""
    return dict(walk_tree(make(root, **tree)))


def test_the_top_layer_lists_what_the_final_image_shows_replaced(tmp_path):
    """Layer 3 replaced four directories; a shared layer cannot know what comes above it,
    so each image's top layer says which of them the image still shows."""
    replaced = [[], [], [], ["opt/back", "opt/file", "opt/gone", "opt/link"]]
    present = view(tmp_path / "a", files=["opt/file"], dirs=["opt/back"],
                   links=[("opt/link", "/srv/x")])
    # opt/back became a directory again above, opt/gone was deleted
    assert replacement_list(replaced, present) == "003/opt/file\n003/opt/link\n"
    # layer 5 replaced opt/file again (it was a directory in layer 4): its entry shows
    again = replaced + [[], ["opt/file"]]
    assert replacement_list(again, present) == "005/opt/file\n003/opt/link\n"
    assert replacement_list([[], []], present) == ""


def test_a_replaced_path_with_a_newline_fails_the_build(tmp_path):
    present = view(tmp_path / "a", files=["x\netc"])
    with pytest.raises(BuildFailed, match=r"replaces '/x\\netc', whose name has a newline"):
        replacement_list([["x\netc"]], present)
