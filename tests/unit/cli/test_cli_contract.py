"""The command's promises to every user: a state dir `init` made, one line per error with a
documented exit code, a closed pipe ends it quietly, untrusted text never drives the terminal."""

from __future__ import annotations

import importlib
import io
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import provisiond
from provisiond.cli import main
from provisiond.cli.context import Context
from provisiond.errors import ExitCode, ProvisiondError, exit_code_table
from provisiond.power.fake import read_fake_bmcs
from provisiond.states import NodePhase
from provisiond.status import record_phase
from tests.conftest import REPO, run_provisiond

ESCAPES = "\x1b[2J\x1b[H\x1b]0;owned\x07\nFAKE ROW\r\x9b31m\u202e"


# --- a state dir that does not exist is not a new cluster ---------------------------------

COMMANDS_NEEDING_STATE = [
    ["node", "list"], ["node", "add", "n1"], ["node", "status"], ["profile", "list"],
    ["image", "list"], ["overlay", "list"], ["overlay", "build"], ["power", "status", "n1"],
    ["slurm", "suspend", "n1", "--log", "{log}"], ["secret", "list"],
    ["apply", "-f", "{apply}"],
]


@pytest.mark.parametrize("argv", COMMANDS_NEEDING_STATE, ids=lambda a: " ".join(a[:2]))
def test_a_missing_state_dir_is_one_line_and_nothing_is_created(tmp_path, capsys, argv):
    typo = tmp_path / "stat"
    (tmp_path / "cluster.yaml").write_text("nodes: {n1: {}}\n")
    argv = [a.format(log=tmp_path / "slurm.log", apply=tmp_path / "cluster.yaml") for a in argv]
    code = main(["--state-dir", str(typo), *argv])
    err = capsys.readouterr().err
    assert code == ExitCode.NOT_FOUND, err
    assert err.count("\n") == 1 and err.startswith("provisiond: error: no provisiond state")
    assert f"provisiond --state-dir {typo} init" in err
    assert not typo.exists()


def test_serve_refuses_a_missing_state_dir_before_starting_anything(tmp_path):
    typo = tmp_path / "stat"
    result = run_provisiond(typo, "serve", "--no-http", "--no-dhcp", "--no-tftp", "--no-dns",
                            timeout=60)
    assert result.returncode == ExitCode.NOT_FOUND, result.stderr
    assert result.stderr.splitlines()[-1].startswith("provisiond: error: no provisiond state")
    assert "Traceback" not in result.stderr and not typo.exists()


def test_an_empty_existing_dir_is_refused_too_and_init_makes_it_usable(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--state-dir", str(empty), "node", "list"]) == ExitCode.NOT_FOUND
    assert list(empty.iterdir()) == []
    assert main(["--state-dir", str(empty), "init", "--no-profiles"]) == 0
    assert main(["--state-dir", str(empty), "node", "add", "n1"]) == 0
    capsys.readouterr()
    assert main(["--state-dir", str(empty), "node", "list"]) == 0
    assert "n1" in capsys.readouterr().out


def test_an_inventory_without_provisiond_yaml_is_still_a_cluster(tmp_path, capsys):
    state = tmp_path / "handmade"
    state.mkdir()
    (state / "inventory.yaml").write_text("revision: 1\nnodes: {n7: {}}\n")
    assert main(["--state-dir", str(state), "node", "list"]) == 0
    assert "n7" in capsys.readouterr().out


def test_the_environment_variable_is_checked_the_same_way(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROVISIOND_STATE_DIR", str(tmp_path / "nosuch"))
    assert main(["node", "list"]) == ExitCode.NOT_FOUND
    assert "no provisiond state in" in capsys.readouterr().err


# --- a closed stdout ----------------------------------------------------------------------

def _run_into_closed_pipe(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """The command with stdout a pipe whose reader is gone (as after `| head -1` exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir))
        return subprocess.run([sys.executable, "-m", "provisiond", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("count", [1, 3000], ids=["flushed-at-exit", "fails-mid-print"])
def test_a_closed_stdout_ends_quietly(cli, state_dir, count):
    assert cli("node", "add", f"n[1-{count}]").code == 0
    result = _run_into_closed_pipe(state_dir, "node", "list")
    assert result.stderr == ""
    assert result.returncode == ExitCode.STDOUT_CLOSED


def test_head_reads_the_first_line_and_the_command_ends_quietly(cli, state_dir):
    assert cli("node", "add", "n[1-3000]").code == 0
    env = dict(os.environ, PROVISIOND_STATE_DIR=str(state_dir))
    lister = subprocess.Popen([sys.executable, "-m", "provisiond", "node", "list"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = lister.stdout.readline()
    lister.stdout.close()  # what head does after its first line
    _, err = lister.communicate(timeout=120)
    assert first.split() == [b"NAME", b"PROFILES", b"IMAGE", b"IPADDR", b"MAC", b"BMC"]
    assert err == b"" and lister.returncode in (0, ExitCode.STDOUT_CLOSED)


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(cli, monkeypatch):
    def broken(args, ctx):
        raise BrokenPipeError(32, "Broken pipe")

    cli("node", "list")
    from provisiond.cli import node

    monkeypatch.setattr(node, "show_status", broken)
    result = cli("node", "status")
    assert result.code == ExitCode.FAILED
    assert result.err == "provisiond: error: Broken pipe\n"


# --- slurm: the known nodes are done, the unknown ones reported -------------------------

@pytest.mark.parametrize("verb, power", [("resume", "on"), ("suspend", "off")])
def test_slurm_acts_on_known_nodes_and_reports_unknown_ones(cli, config, tmp_path, verb,
                                                            power):
    assert cli("node", "add", "n[1-2]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    if verb == "suspend":
        assert cli("power", "on", "n[1-2]").code == 0
    log = tmp_path / "slurm.log"
    result = cli("slurm", verb, "n1,nosuch,n2,gone[1-2]", "--log", str(log))
    assert result.code == ExitCode.NOT_FOUND
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert {name: bmc["power"] for name, bmc in bmcs.items()} == {"n1": power, "n2": power}
    text = log.read_text()
    for name in ("nosuch", "gone1", "gone2"):
        assert f"slurm {verb} {name}: error: no such node" in text
    assert f"slurm {verb} n1: ok" in text and f"slurm {verb} n2: ok" in text


def test_slurm_with_only_unknown_nodes_logs_each_and_exits_not_found(cli, tmp_path):
    log = tmp_path / "slurm.log"
    assert cli("slurm", "resume", "x[1-2]", "--log", str(log)).code == ExitCode.NOT_FOUND
    assert log.read_text().count("error: no such node") == 2


# --- exit codes: one table, in errors.py, --help and README -------------------------------

def _all_error_classes() -> set[type]:
    for module in pkgutil.walk_packages(provisiond.__path__, "provisiond."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found, todo = set(), [ProvisiondError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_exits_with_a_code_of_the_table():
    for cls in _all_error_classes():
        assert cls.exit_code in set(ExitCode), cls
        assert type(cls.exit_code) is ExitCode, f"{cls.__name__}: a bare number"


def test_help_and_readme_show_the_same_table(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    readme = (REPO / "README.md").read_text()
    for code, meaning in exit_code_table():
        assert f"{code} {meaning}" in help_text
        assert f"| {code} | {meaning} |" in readme


def test_usage_errors_exit_with_the_invalid_input_code(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["node", "add"])
    assert caught.value.code == ExitCode.INVALID_INPUT
    assert main([]) == ExitCode.INVALID_INPUT


@pytest.mark.parametrize("argv,says", [
    (["image", "import", "--tls-verify=no", "oci:x", "y"],
     "image import: argument --tls-verify: expected true or false (or 1, 0, t, f, as skopeo "
     "takes them), not 'no'"),
    (["image", "import", "--tls-verify", "false", "oci:x", "y"],
     "image import: --tls-verify takes its value after '=': --tls-verify=false"),
    (["image", "import", "oci:x", "--tls-verify", "false"],  # NAME false, verifying
     "image import: --tls-verify takes its value after '=': --tls-verify=false"),
    (["image", "import", "oci:x", "y", "--tls-verify", "0"],
     "image import: --tls-verify takes its value after '=': --tls-verify=0"),
    (["image", "import", "--tls-verify=false"],
     "image import: the following arguments are required: SOURCE, name "),
    (["image", "import", "--insecure=false", "oci:x", "y"],
     "image import: --insecure takes no value, not 'false': give --insecure alone, or "
     "leave it out"),
    (["bootdev", "pxe", "n1", "--uefi=false"], "bootdev pxe: --uefi takes no value"),
    (["power", "on", "n1", "--timeout", "soon"],
     "power on: argument --timeout: invalid float value: 'soon'"),
    (["secret", "rotate", "n1", "munge.key"], "secret rotate: argument what: invalid choice"),
    (["node"], "node: the following arguments are required: VERB"),
    (["node", "list", "n1", "\x1b[2J"], "node list: unrecognized arguments: \\x1b[2J"),
])
def test_a_usage_error_is_one_line_without_the_usage(capsys, argv, says):
    """As every other error (README, Exit codes): argparse's usage synopsis, eight lines for
    `image import`, hid the one line that said what was wrong."""
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == ExitCode.INVALID_INPUT
    assert err.startswith(f"provisiond: error: {says}") and err.count("\n") == 1, err
    assert err.endswith(" --help`)\n") and "usage:" not in err


@pytest.mark.parametrize("argv,command,stray", [
    (["node", "set", "n1", "--imgae", "x"], "node set", "--imgae x"),  # a mistyped option
    (["node", "list", "n1", "n2"], "node list", "n2"),  # a second word
    (["secret", "unset", "node", "n1", "key", "--json"], "secret unset", "--json"),
    (["--bogus"], "", "--bogus"),
])
def test_unrecognized_arguments_name_the_command_that_did_not_take_them(capsys, argv,
                                                                         command, stray):
    """The commonest usage error: argparse finds the stray words only once the command's
    parser has returned, and said `see provisiond --help`, which lists no option of it."""
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == ExitCode.INVALID_INPUT
    where = f"{command}: " if command else ""
    prog = f"provisiond {command}".strip()
    assert err == (f"provisiond: error: {where}unrecognized arguments: {stray} "
                   f"(see `{prog} --help`)\n")


def test_tls_verify_takes_skopeos_true_and_false_after_an_equals_sign(cli):
    """Each value parsed: false is refused only as a registry option with a local source."""
    assert cli("init").code == 0
    for value, verify in (("false", False), ("False", False), ("0", False), ("f", False),
                          ("TRUE", True), ("1", True), ("t", True)):
        result = cli("image", "import", f"--tls-verify={value}", "oci:nothing-here", "y")
        assert result.code == ExitCode.INVALID_INPUT and result.err.count("\n") == 1, result
        assert ("--tls-verify" in result.err) is not verify, result.err
        assert "nothing-here is not an OCI layout" in result.err or not verify, result.err


# --- untrusted text is escaped ------------------------------------------------------------

def test_status_detail_with_escape_codes_cannot_repaint_the_table(cli, config):
    assert cli("node", "add", "n[1-2]").code == 0
    record_phase(config, "n1", NodePhase.FAILED, ESCAPES)
    out = cli("node", "status").out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "\x9b" not in out and "\u202e" not in out
    lines = out.splitlines()  # header, n1, n2, n1's failure in full: no forged row
    assert len(lines) == 4 and lines[3].startswith("n1 failed: \\x1b[2J"), out
    assert "\\x1b[2J" in out and "FAKE ROW" in out


def test_error_lines_escape_what_the_user_typed(cli):
    result = cli("node", "show", "n1\x1b[2J")
    assert result.code != 0
    assert "\x1b" not in result.err and "\\x1b" in result.err


def test_every_table_cell_and_line_goes_through_the_same_escape(capsys):
    Context.print_table(["NAME", "COMMENT"], [["n1", ESCAPES], ["n2", "tab\there"]])
    Context.print_line(f"image: {ESCAPES}")
    out = capsys.readouterr().out
    assert out.isprintable() is False  # only the newlines that end lines remain
    assert all(line.isprintable() for line in out.splitlines())
    assert len(out.splitlines()) == 4


def test_plain_text_and_other_scripts_pass_unchanged():
    from provisiond.cli.context import printable

    for text in ["n001", "café ünïcode", "节点 42", "a\\nb", "tags: rack=r1, gpu=a100"]:
        assert printable(text) == text


# --- slurm: whatever fails is recorded once, where Slurm's admin reads it -----------------

@pytest.mark.parametrize("verb", ["resume", "suspend"])
def test_slurm_logs_a_missing_state_dir_to_its_log(tmp_path, capsys, verb):
    log = tmp_path / "slurm.log"
    code = main(["--state-dir", str(tmp_path / "typo"), "slurm", verb, "n1", "--log", str(log)])
    assert code == ExitCode.NOT_FOUND
    assert f"slurm {verb} n1: no provisiond state in" in log.read_text()
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("verb", ["resume", "suspend"])
def test_slurm_on_a_terminal_prints_an_error_once(tmp_path, capsys, monkeypatch, verb):
    from provisiond.cli import slurm

    monkeypatch.setattr(slurm, "SYSLOG_SOCKET", str(tmp_path / "no-syslog"))
    assert main(["--state-dir", str(tmp_path / "typo"), "slurm", verb, "n1"]) == 3
    err = capsys.readouterr().err
    assert err.count("no provisiond state") == 1, err


def test_slurm_with_a_log_that_cannot_be_written_says_so_in_one_line(cli, tmp_path):
    assert cli("node", "add", "n[1-2]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    result = cli("slurm", "suspend", "n[1-2]", "--log", "/dev/full")
    assert result.code == ExitCode.FAILED
    assert result.err == ("provisiond: error: cannot write the log: No space left on device: "
                          "/dev/full\n")


def test_slurm_with_a_log_that_cannot_be_opened_still_does_the_nodes(cli, config, tmp_path):
    """A power_log SlurmUser may not create (a typo, a root-owned folder): the nodes are
    still done, as with a log that fills up; only their outcomes are lost. It did nothing,
    so Slurm waited ResumeTimeout for nodes nobody had powered on."""
    from provisiond.power.fake import read_fake_bmcs

    assert cli("node", "add", "n[1-2]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    log = tmp_path / "no-such-dir" / "power.log"
    result = cli("slurm", "suspend", "n[1-2]", "--log", str(log))
    assert result.code == ExitCode.FAILED
    assert result.err == (f"provisiond: error: cannot write the log: No such file or "
                          f"directory: {log}\n")
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert [bmcs[name]["power"] for name in ("n1", "n2")] == ["off", "off"]


def test_slurm_log_lines_cannot_be_forged_by_a_name(cli, tmp_path):
    log = tmp_path / "slurm.log"
    result = cli("slurm", "resume", "x1,n1\nFORGED n2: ok", "--log", str(log))
    assert result.code == ExitCode.NOT_FOUND, result.err
    lines = log.read_text().splitlines()
    assert not any(line.startswith("FORGED") for line in lines), lines


# --- Ctrl-C at any moment ------------------------------------------------------------------

def test_ctrl_c_while_the_command_starts_is_one_line_not_a_traceback(monkeypatch, capsys):
    import provisiond.cli as cli_package

    def interrupted():
        raise KeyboardInterrupt  # as while argparse is built and the noun modules import

    monkeypatch.setattr(cli_package, "build_parser", interrupted)
    with pytest.raises(SystemExit) as caught:
        cli_package.entry()
    assert caught.value.code == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == "provisiond: interrupted\n"


def test_the_entry_point_imports_little_before_it_can_catch_ctrl_c():
    """What `import provisiond.cli` runs is outside any handler: a Ctrl-C there is a
    traceback, so the heavy imports (config, pydantic) wait until main() runs."""
    probe = ("import sys, provisiond.cli; "
             "print(sorted(m for m in ('provisiond.config', 'pydantic') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.stdout.strip() == "[]", result.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream_type", [io.StringIO, _Terminal], ids=["pipe", "terminal"])
def test_image_build_progress_escapes_what_the_recipe_says(stream_type):
    from provisiond.cli.image import Progress

    stream = stream_type()
    with Progress(stream) as progress:
        for status in ("building", "built"):
            progress({"index": 1, "count": 1, "kind": "apt", "description": ESCAPES,
                      "status": status, **({"size": 10, "seconds": 1.0}
                                           if status == "built" else {})})
    shown = stream.getvalue().replace("\r\x1b[K", "")  # the bar's own redraw, on a terminal
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "FAKE ROW" not in shown.splitlines()


def _no_raw_escapes(out: str) -> None:
    assert all(line.isprintable() for line in out.splitlines()), out
    assert "FAKE ROW" not in out.splitlines()


def test_image_show_and_list_escape_a_hand_edited_manifest(cli, config):
    """Each line `image show` prints carries manifest text (kernel, init, args, recipe)."""
    manifest = {"name": "img1", "total_size": 1, "built_at": "2026-01-01T00:00:00Z",
                "build_seconds": 1.0, "init": f"/sbin/init{ESCAPES}",
                "kernel": {"version": f"6.1{ESCAPES}", "digest": f"sha256:{ESCAPES}",
                           "size": 1},
                "kernel_args": [f"quiet{ESCAPES}"], "recipe": {"path": f"r{ESCAPES}.yaml"},
                "layers": [{"kind": "apt", "size": 1, "digest": "sha256:0",
                            "description": ESCAPES}]}
    path = config.images_dir / "img1" / "manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))
    for argv in (["image", "show", "img1"], ["image", "list"]):
        result = cli(*argv)
        assert result.code == 0, result.err
        _no_raw_escapes(result.out)


def test_overlay_show_and_list_escape_names_from_the_overlay_tree(cli, config):
    """An overlay's name is printed escaped; a file name with control characters is
    refused (a node could not copy it), in a line that shows it escaped."""
    name = "ov\x1b[2J\nFAKE ROW"
    (config.state_dir / "overlays" / name / "etc").mkdir(parents=True)
    (config.state_dir / "overlays" / name / "etc" / "f").write_text("x\n")
    for argv in (["overlay", "show", name], ["overlay", "list"]):
        result = cli(*argv)
        assert result.code == 0, result.err
        _no_raw_escapes(result.out)
    (config.state_dir / "overlays" / name / "etc" / f"f{ESCAPES}").write_text("x\n")
    result = cli("overlay", "show", name)
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    _no_raw_escapes(result.err)
