"""`provisiond overlay ...` in-process."""

from __future__ import annotations

import json

import pytest

from provisiond import events
from provisiond.errors import NodeNotFound
from tests.unit.overlays.test_build import write_inventory


def test_list_and_show(cli, state_dir):
    result = cli("overlay", "list", "--json")
    names = {o["name"]: o for o in json.loads(result.out)}
    assert {"init", "hostname", "hosts", "network", "agent", "ssh"} <= set(names)
    assert names["ssh"]["kind"] == "runtime only"
    shown = cli("overlay", "show", "hosts")
    assert shown.code == 0 and "/etc/hosts" in shown.out and "template" in shown.out
    assert "templates use: nodes, server" in shown.out
    assert cli("overlay", "show", "nope").code == 3


def test_render_prints_one_file_and_hides_secrets(cli, state_dir):
    write_inventory(state_dir)
    result = cli("overlay", "render", "n1", "hostname", "/etc/hostname")
    assert result.code == 0 and result.out == "n1\n"
    key = cli("overlay", "render", "n1", "ssh", "/etc/ssh/ssh_host_ed25519_key")
    assert key.out == "<secrets.ssh_host_keys.ed25519.private>\n"
    key = cli("overlay", "render", "n1", "ssh", "/etc/ssh/ssh_host_ecdsa_key.pub")
    assert key.out == "<secrets.ssh_host_keys.ecdsa.public>\n"
    missing = cli("overlay", "render", "n1", "hostname", "/etc/nothing")
    assert missing.code == 2 and "has no file /etc/nothing" in missing.err


def test_an_overlay_reading_secrets_is_runtime_only_without_saying_so(cli, state_dir, config):
    """Templates reading `secrets` make an overlay runtime-only (its overlay.yaml need not
    say `secret: true`): listed, shown and rendered (secrets as placeholders) as one."""
    from provisiond.inventory.secrets import SecretStore

    folder = state_dir / "overlays" / "munge" / "etc" / "munge"
    folder.mkdir(parents=True)
    (folder / "munge.key.j2").write_text('{{ secrets["munge.key"] }}\n')
    write_inventory(state_dir, runtime=["ssh", "munge"])
    SecretStore(config).set("nodes", ["n1"], "munge.key", "the-munge-key-itself")
    listed = {o["name"]: o for o in json.loads(cli("overlay", "list", "--json").out)}
    assert listed["munge"]["kind"] == "runtime only"
    assert "(runtime only: holds secrets)" in cli("overlay", "show", "munge").out
    rendered = cli("overlay", "render", "n1", "munge", "/etc/munge/munge.key")
    assert (rendered.code, rendered.out) == (0, "<secrets.munge.key>\n"), rendered.err


def test_build_summary_then_reuse(cli, state_dir):
    write_inventory(state_dir)
    first = cli("overlay", "build", "n[1-2]")
    assert first.code == 0, first.err
    assert "shared: 1 rebuilt, 0 reused" in first.out
    assert "system: 2 rebuilt, 0 reused" in first.out
    again = json.loads(cli("overlay", "build", "--json").out)
    assert again["reused"] == {"shared": 1, "system": 2, "runtime": 2}
    assert again["rebuilt"] == {"shared": 0, "system": 1, "runtime": 1}


def test_build_failure_is_one_line(cli, state_dir):
    write_inventory(state_dir, system=["nosuch"])
    result = cli("overlay", "build")
    assert result.code == 5
    assert result.err.count("\n") == 1 and "no overlay named 'nosuch'" in result.err


def test_bad_overlay_yaml_is_one_line(cli, state_dir):
    folder = state_dir / "overlays" / "odd"
    (folder / "etc").mkdir(parents=True)
    (folder / "etc/motd").write_text("hi\n")
    for meta, words in (("modes: {etc/motd: rw}\n", "not an octal mode"),
                        # YAML reads an unquoted 0640 as 416: it once became mode 0416
                        ("modes: {etc/motd: 0640}\n", "416 is not an octal mode in quotes"),
                        ("modes: [etc/motd]\n", "modes: expected a mapping")):
        (folder / "overlay.yaml").write_text(meta)
        result = cli("overlay", "show", "odd")
        assert result.code == 2 and result.err.count("\n") == 1, result.err
        assert words in result.err and "overlay.yaml" in result.err


def test_declared_links_are_packed_as_symlinks_with_their_parents(cli, state_dir):
    """`links:` in overlay.yaml: how the shipped overlays carry symlinks in a wheel."""
    from provisiond.config import load_config
    from provisiond.overlays.source import load_overlay

    folder = state_dir / "overlays" / "linked"
    (folder / "etc").mkdir(parents=True)
    (folder / "etc/motd").write_text("hi\n")
    (folder / "overlay.yaml").write_text("links: {etc/x.wants/a.service: ../a.service}\n")
    overlay = load_overlay(load_config(state_dir), "linked")
    links = [(f.target, f.kind, f.data) for f in overlay.files if f.kind == "symlink"]
    assert links == [("etc/x.wants/a.service", "symlink", b"../a.service")]
    shown = cli("overlay", "show", "linked")
    assert shown.code == 0 and "etc/x.wants/a.service" in shown.out


def test_bad_links_are_one_line(cli, state_dir):
    folder = state_dir / "overlays" / "odd"
    (folder / "etc").mkdir(parents=True)
    (folder / "etc/motd").write_text("hi\n")
    for meta in ("links: [etc/a]\n", "links: {../escape: /x}\n", "links: {etc/motd: /x}\n",
                 "links: {etc/a: ''}\n", "links: {etc/a: 3}\n", 'links: {etc/a: "x\\ny"}\n'):
        (folder / "overlay.yaml").write_text(meta)
        result = cli("overlay", "show", "odd")
        assert result.code == 2 and result.err.count("\n") == 1, (meta, result.err)
        assert "links:" in result.err and "overlay.yaml" in result.err


def test_a_failing_template_never_prints_a_secret(cli, state_dir):
    write_inventory(state_dir, runtime=("leaky",))
    folder = state_dir / "overlays" / "leaky"
    (folder / "etc").mkdir(parents=True)
    (folder / "overlay.yaml").write_text("secret: true\n")
    (folder / "etc/key.j2").write_text(
        "{{ secrets.ssh_host_keys.ed25519.private | prefixlen }}\n")
    result = cli("overlay", "build", "n1")
    assert result.code != 0 and "overlay leaky, file etc/key.j2, line 1, node n1" in result.err
    key = (state_dir / "secrets/ssh-host-keys/n1/ssh_host_ed25519_key").read_text()
    assert all(line not in result.err + result.out for line in key.splitlines()[1:-1])


def test_builds_tell_the_event_journal(cli, state_dir, config):
    write_inventory(state_dir)
    assert cli("overlay", "build", "n[1-2]").code == 0
    assert cli("overlay", "build", "n7").code == 3
    builds = events.read_since(config, 0, kinds=frozenset({"build."}))
    assert [(e.kind, e.subject) for e in builds] == [
        ("build.started", "overlays/n[1-2]"), ("build.finished", "overlays/n[1-2]"),
        ("build.started", "overlays/n7"), ("build.failed", "overlays/n7")]
    assert builds[1].data["rebuilt"]["system"] == 2
    assert builds[3].data["message"] == "no node named 'n7'"


def test_build_events_of_many_scattered_nodes_fit_a_journal_line(config):
    from provisiond.overlays import build_overlays

    names = [f"n{2 * i}" for i in range(1, 4001)]  # folds to ~20 KB
    with pytest.raises(NodeNotFound):
        build_overlays(config, names)
    builds = events.read_since(config, 0, kinds=frozenset({"build."}))
    assert [e.kind for e in builds] == ["build.started", "build.failed"]
    assert builds[0].subject.endswith(",... (4000 nodes)") and len(builds[0].subject) < 2100


@pytest.mark.parametrize("bad", ["bad\nname", "tab\there", "esc\x1b[2J", "bidi\u202ename",
                                 "dir\nname/motd", b"latin\xe9".decode(errors="surrogateescape")])
def test_a_file_name_a_node_cannot_copy_fails_the_nodes_using_its_overlay(cli, state_dir,
                                                                        bad):
    """A site overlay's file named with a newline broke the node's /init, which copies the
    overlay a file name a line: the build packed it. Refused now in one line naming the
    overlay and the file (repr); the nodes not using the overlay still build."""
    import yaml

    write_inventory(state_dir, system=["hostname"])
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    data["nodes"]["n2"]["system_overlays"] = ["site"]
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    path = state_dir / "overlays" / "site" / "etc" / bad
    path.parent.mkdir(parents=True)
    path.write_text("hi\n")
    result = cli("overlay", "build")
    what = ("its name is not UTF-8: rename it" if bad.startswith("latin") else
            "a control character in its name (a newline breaks the node's copy of the "
            "overlay): rename it")
    assert result.code == 5, result.err
    assert result.err.splitlines() == [
        f"provisiond: error: overlay site: file {'etc/' + bad.split('/')[0]!r}: {what}"
    ], result.err  # a folder's name: the folder named
    built = state_dir / "overlay-builds"
    assert (built / "n1/system.cpio.zst").is_file() and (built / "n3/system.cpio.zst").is_file()
    assert not list((built / "n2").glob("system.*"))
    shown = cli("overlay", "show", "site")
    assert shown.code == 2 and shown.err.splitlines() == result.err.splitlines()


def _site_overlay_on_n2(state_dir):
    import yaml

    write_inventory(state_dir, system=["hostname"])
    data = yaml.safe_load((state_dir / "inventory.yaml").read_text())
    data["nodes"]["n2"]["system_overlays"] = ["site"]
    (state_dir / "inventory.yaml").write_text(yaml.safe_dump(data))
    folder = state_dir / "overlays" / "site" / "etc"
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("mark, why", [
    ("a\x1bb", "a control character in it"),
    ("../../../tmp/outside", "not a path below the template's folder"),
    ("a/./b", "not a path below the template's folder"),
    ("/", "not a path below the template's folder")])
def test_a_file_name_a_template_renders_follows_the_overlay_file_name_rule(cli, state_dir,
                                                                          mark, why):
    """A template's `#@file NAME` (node data may be in it) went into the archive as it
    was: with `../`, as `.provisiond/overlays/etc/../../../tmp/outside`, a file outside the
    overlay's copy on the node; with an escape character, as the checked names are not.
    The node's build fails in one line naming the overlay, the file, the node and the
    mark, as for any template error; the others are built."""
    folder = _site_overlay_on_n2(state_dir)
    (folder / "x.j2").write_text(f"#@file fine\nhi\n#@file {mark}\nho\n")
    result = cli("overlay", "build")
    assert result.code == 5, result.err
    assert result.err.splitlines() == [
        f"provisiond: error: overlay site, file etc/x.j2, node n2: `#@file {mark!r}`: {why}"
    ], result.err
    built = state_dir / "overlay-builds"
    assert (built / "n1/system.cpio.zst").is_file() and (built / "n3/system.cpio.zst").is_file()


@pytest.mark.parametrize("target, why", [
    (b"/usr/lib/x\xe9", "its target '/usr/lib/x\\udce9' is not UTF-8"),
    (b"/usr/lib/a\nb", "a control character in its target '/usr/lib/a\\nb'")])
def test_a_symlink_target_follows_the_links_target_rule(cli, state_dir, target, why):
    """A symlink of the tree whose target was not UTF-8 stopped `overlay build` with a
    UnicodeEncodeError traceback; one with a control character was packed, where the same
    target under `links:` is refused. One line now, as for `links:`."""
    import os

    folder = _site_overlay_on_n2(state_dir)
    os.symlink(target, bytes(folder / "link"))
    result = cli("overlay", "build")
    assert result.code == 5, result.err
    assert result.err.splitlines() == [
        f"provisiond: error: overlay site: symlink 'etc/link': {why}: link it again"
    ], result.err
    built = state_dir / "overlay-builds"
    assert (built / "n1/system.cpio.zst").is_file()


def _broken_overlays(state_dir) -> None:
    """Three site overlays that cannot be read, each in its own way."""
    for name, (rel, text) in {"badmeta": ("overlay.yaml", "modes: [etc/motd]\n"),
                              "badsyntax": ("etc/motd.j2", "{% if node.name %}\n"),
                              "badname": ("etc/mo\ttd", "hi\n")}.items():
        path = state_dir / "overlays" / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_list_shows_every_overlay_and_the_broken_ones_with_their_error(cli, state_dir):
    """One overlay that cannot be read failed the whole listing, in one line naming it."""
    _broken_overlays(state_dir)
    result = cli("overlay", "list", "--json")
    assert result.code == 2
    listed = {o["name"]: o for o in json.loads(result.out)}
    assert {"init", "hostname", "hosts", "ssh", "badmeta", "badsyntax", "badname"} <= set(
        listed)
    assert listed["hostname"]["error"] is None and listed["hostname"]["files"] == 1
    assert "modes: expected a mapping" in listed["badmeta"]["error"]
    assert "overlay badsyntax, file etc/motd.j2, line" in listed["badsyntax"]["error"]
    assert "a control character" in listed["badname"]["error"]
    assert all(listed[n]["files"] is None and listed[n]["kind"] is None
               for n in ("badmeta", "badsyntax", "badname"))
    assert result.err.count("\n") == 3 and "overlay badname: " in result.err
    text = cli("overlay", "list")
    assert text.code == 2 and text.err == result.err
    rows = {line.split()[0]: line for line in text.out.splitlines()[1:]}
    assert set(listed) == set(rows) and " broken " in rows["badmeta"]
    assert " any " in rows["hostname"]


def test_an_overlay_yaml_that_is_not_utf8_is_one_broken_row_not_a_traceback(cli, state_dir):
    folder = state_dir / "overlays" / "latin1"
    folder.mkdir(parents=True)
    (folder / "overlay.yaml").write_bytes(b"description: caf\xe9\n")
    result = cli("overlay", "list", "--json")
    assert result.code == 2, result.err
    listed = {o["name"]: o for o in json.loads(result.out)}
    assert "overlay.yaml: not UTF-8 (byte 16)" in listed["latin1"]["error"]
    assert listed["hostname"]["error"] is None
