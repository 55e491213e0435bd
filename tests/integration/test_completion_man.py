"""Shell completion (bash, and zsh through bashcompinit) run in the real shells, and the man
page rendered by groff: both generated from the CLI's own parser."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from provisiond.cli import build_parser
from provisiond.cli.commands import walk
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import NetDev, Record
from tests.tools import tool

VENV_BIN = Path(sys.executable).parent
HARNESS = {  # COMP_WORDS in, COMPREPLY out, as the shells' completion machinery calls it
    "bash": 'source <(provisiond completion bash)\n'
            'comp() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=();'
            ' _provisiond; printf "%s\\n" "${COMPREPLY[*]}"; }\n',
    # zsh's compgen -F calls the function under `emulate -L sh` (bashcompinit)
    "zsh": 'source <(provisiond completion zsh)\n'
           'comp() { emulate -L sh; setopt kshglob noshglob braceexpand; COMP_WORDS=("$@");'
           ' COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); _provisiond;'
           ' printf "%s\\n" "${COMPREPLY[*]}"; }\n',
}


@pytest.fixture
def cluster(config):
    with InventoryStore(config).edit() as inv:
        for name in ("n1", "n2", "n3", "gpu1"):
            inv.nodes[name] = Record(netdevs={"eth0": NetDev()})
        inv.profiles["compute"] = Record()
    return config.state_dir


def complete(shell: str, cwd: Path, *lines: list[str]) -> list[list[str]]:
    """COMPREPLY for each command line (its last word the one being completed)."""
    script = HARNESS[shell] + "".join(
        "comp " + " ".join(_quote(w) for w in words) + "\n" for words in lines)
    argv = [tool("bash"), "-c", script] if shell == "bash" else [tool("zsh"), "-f", "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(cwd),
                               "PROVISIOND_STATE_DIR": "/nonexistent"})
    assert done.returncode == 0 and not done.stderr, done.stderr
    return [line.split() for line in done.stdout.splitlines()]


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_of_commands_options_choices_and_names(shell, cluster, tmp_path):
    (tmp_path / "gpu1,n2").write_text("")  # gpu1,n[1-3] stays a range, not this file
    state = ["provisiond", "--state-dir", str(cluster)]
    got = complete(shell, tmp_path,
                   ["provisiond", "po"],
                   ["provisiond", "node", ""],
                   ["provisiond", "doctor", "--j"],
                   [*state, "power", "on", ""],
                   [*state, "node", "set", "n1", "--profile", "c"],
                   [*state, "node", "set", "n1", "--image", "ti"],
                   [*state, "node", "set", "n1", "--system-overlay", "ho"],
                   [*state, "token", "create", "--role", ""],
                   [*state, "serve", "--log-format", ""],
                   [*state, "secret", "set", ""],
                   [*state, "image", "show", "n"])
    node_verbs = next(c.children for c in walk(build_parser()) if c.words == ("node",))
    assert got == [["power"],
                   node_verbs,
                   ["--json"],
                   ["gpu1", "n1", "n2", "n3", "gpu1,n[1-3]"],  # and all as one range
                   ["compute"],
                   ["tiny"],
                   ["hostname", "hosts"],
                   ["reader", "operator", "admin"],
                   ["text", "json"],
                   ["node", "profile"],
                   []], got


def test_completion_names_without_a_state_dir_print_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "provisiond", "--state-dir",
                           str(tmp_path / "none"), "completion", "names", "nodes"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_man_page_renders_without_warnings_and_names_every_command_and_option():
    page = subprocess.run([sys.executable, "-m", "provisiond", "man"], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    lint = subprocess.run([tool("groff"), "-man", "-ww", "-z"], input=page,
                          capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stderr, lint.stderr
    text = subprocess.run([tool("groff"), "-man", "-Tascii", "-P", "-cbou"], input=page,
                          capture_output=True, text=True, timeout=60, check=True).stdout
    text = re.sub(r"-\n\s*", "-", text)  # hyphenated line ends
    flat = " ".join(text.split())
    for command in walk(build_parser())[1:]:
        assert " ".join(command.words) in flat, command.words
        for action in command.options:
            for flag in [] if "-h" in action.option_strings else action.option_strings:
                assert flag in flat, (command.words, flag)
    assert "EXIT STATUS" in flat and "doctor: a check found something" in flat
