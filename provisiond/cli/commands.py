"""The command tree read from the argparse parser itself, for what is generated from it
(shell completion, the man page): nothing about a command is written down twice."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# What a positional or an option's value names, for completion: by its dest, then by the
# command's noun for the generic `name`/`names` ("nodes", "profiles", "images",
# "overlays", "files", "dirs"; None: free text).
KIND_BY_DEST = {"range": "nodes", "hostlist": "nodes", "node": "nodes", "archive": "files",
                "state_dir": "dirs", "image": "images", "profile": "profiles",
                "system_overlay": "overlays", "runtime_overlay": "overlays", "file": "files",
                "bmc_password_file": "files", "unit_dir": "dirs"}
KIND_BY_NOUN = {"node": "nodes", "profile": "profiles", "image": "images",
                "overlay": "overlays"}


@dataclass
class Command:
    """One command of the tree: its words (("node", "add")), help, options, positionals."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str = ""
    children: list[str] = field(default_factory=list)

    @property
    def options(self) -> list[argparse.Action]:
        return [a for a in self.parser._actions if a.option_strings]

    @property
    def positionals(self) -> list[argparse.Action]:
        return [a for a in self.parser._actions
                if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]

    def kind(self, action: argparse.Action) -> str | None:
        """What the action's value names (see KIND_BY_DEST)."""
        if action.dest in KIND_BY_DEST:
            return KIND_BY_DEST[action.dest]
        if action.dest in ("name", "names") and self.words:
            return KIND_BY_NOUN.get(self.words[0])
        return None


def walk(parser: argparse.ArgumentParser, words: tuple[str, ...] = (), help: str = ""
         ) -> list[Command]:
    """Every command of the tree, parents before their children."""
    command = Command(words, parser, help)
    found = [command]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                command.children.append(name)
                found += walk(child, (*words, name), helps.get(name, ""))
    return found


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0
