"""The image CLI's own output: progress lines or bar, errors as one line."""

from __future__ import annotations

import io

from provisiond.cli.image import Progress

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
