"""The image CLI's own output: progress lines or bar, errors as one line."""

from __future__ import annotations

import io
import json
import os
import time

from provisiond.cli.image import Progress
from provisiond.state.layout import Layout

EVENTS = [{"image": "t", "index": 1, "count": 2, "kind": "busybox", "description": "base",
           "status": "cached", "size": 2048, "seconds": 0.0},
          {"image": "t", "index": 2, "count": 2, "kind": "copy", "description": "files",
           "status": "building"},
          {"image": "t", "index": 2, "count": 2, "kind": "copy", "description": "files",
           "status": "built", "size": 10, "seconds": 0.25}]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_progress_is_one_line_per_event():
    out = io.StringIO()
    with Progress(out) as progress:
        for event in EVENTS:
            progress(event)
    assert out.getvalue().splitlines() == [
        "[1/2] busybox: base ... cached 2.0 KiB in 0.0s",
        "[2/2] copy: files ... building",
        "[2/2] copy: files ... built 10 B in 0.2s"]


def test_tty_progress_draws_a_bar():
    out = Tty()
    with Progress(out) as progress:
        for event in EVENTS:
            progress(event)
    text = out.getvalue()
    assert "\r\x1b[K[##########----------] [2/2] copy: files building" in text
    assert "[####################] [2/2] copy: files built" in text


PULL = [{"index": 1, "count": 2, "kind": "pull", "description": "config sha256:ab",
         "status": "present", "size": 300},
        {"index": 2, "count": 2, "kind": "pull", "description": "layer sha256:cd",
         "status": "fetching"},
        {"index": 2, "count": 2, "kind": "pull", "description": "layer sha256:cd",
         "status": "fetched", "size": 4096}]


def test_registry_pull_progress_has_sizes_without_times():
    out = io.StringIO()
    with Progress(out) as progress:
        for event in PULL:
            progress(event)
    assert out.getvalue().splitlines() == [
        "[1/2] pull: config sha256:ab ... present 300 B",
        "[2/2] pull: layer sha256:cd ... fetching",
        "[2/2] pull: layer sha256:cd ... fetched 4.0 KiB"]
    tty = Tty()
    with Progress(tty) as progress:
        progress(PULL[1])
    # redrawn in place: no newline of its own (the one at the end is the context's exit)
    assert tty.getvalue() == ("\r\x1b[K[##########----------] [2/2] pull: layer sha256:cd "
                              "fetching\n")


def test_unknown_image_is_one_line_and_exit_3(cli):
    result = cli("image", "show", "nope")
    assert result.code == 3
    assert result.err == "provisiond: error: no image named 'nope' has been built\n"
    result = cli("image", "build", "nope")
    assert result.code == 3 and result.err.startswith("provisiond: error: no recipe for image")


def test_list_is_empty_and_json(cli):
    assert cli("image", "list", "--json").out.strip() == "[]"
    assert cli("image", "list").out.split() == ["NAME", "LAYERS", "SIZE", "KERNEL", "AGE",
                                                "BUILD"]


def test_gc_shows_kept_shell_tarballs_and_says_how_to_keep_or_remove_them(cli, config):
    """`image gc` printed blobs and trees only: the tarballs of `image shell` sessions
    whose layer could not be added piled up in images/NAME/shell/ unseen."""
    folder = Layout.of(config).image_shell_dir("site")
    folder.mkdir(parents=True)
    kept = folder / f"{'a' * 64}.tar"
    kept.write_bytes(b"x" * 3072)
    two_days_ago = time.time() - 2 * 86400 - 60
    os.utime(kept, (two_days_ago, two_days_ago))
    result = cli("image", "gc")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "removed 0 blob(s), freed 0 B, 0 cached layer tree(s)",
        "kept 1 `image shell` layer tarball(s) no image lists (a session's layer that could "
        "not be added), 3.0 KiB:",
        f"  {kept}  3.0 KiB, 2d ago",
        "  to keep one, add it to a recipe as a layer ({kind: tar, path: FILE}); "
        "`provisiond image gc --shell-tarballs` removes them"]
    assert kept.is_file()
    result = cli("image", "gc", "--shell-tarballs", "--json")
    assert result.code == 0, result.err
    assert [t["path"] for t in json.loads(result.out)["shell_tarballs_removed"]] == [str(kept)]
    assert not kept.exists()
    result = cli("image", "gc")
    assert result.out.splitlines() == ["removed 0 blob(s), freed 0 B, 0 cached layer tree(s)"]


def test_gc_says_what_it_did_with_half_written_tarballs_and_unreadable_listings(cli, config):
    """Each in one line: a killed session's half-written tarball (removed), an image whose
    shell.json cannot be read (its tarballs left as they are)."""
    layout = Layout.of(config)
    layout.image_shell_dir("one").mkdir(parents=True)
    (layout.image_shell_dir("one") / ".layer.abc").write_bytes(b"x" * 2048)
    layout.image_shell_dir("two").mkdir(parents=True)
    (layout.image_shell_dir("two") / f"{'b' * 64}.tar").write_bytes(b"x")
    layout.image_shell_layers("two").write_text("[{")
    result = cli("image", "gc")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[1] == ("removed 1 half-written `image shell` layer tarball(s) of killed "
                        "sessions, 2.0 KiB")
    assert lines[2].startswith(f"image two: {layout.image_shell_layers('two')} is unreadable")
    assert lines[2].endswith(": its `image shell` tarballs are left as they are")
    assert len(lines) == 3, lines
