"""`provisiond completion bash|zsh`: a completion script generated from the parser (commands,
options, choices); node, profile, image and overlay names come from the state directory at
completion time through `provisiond completion names KIND`."""

from __future__ import annotations

import argparse
import shlex

from provisiond.cli.commands import Command, takes_value, walk

KINDS = ("nodes", "profiles", "images", "overlays")
NOT_NAMES = {("firmware", "image")}  # firmware update --image takes a URL

BASH_BODY = r'''
_provisiond_names() {  # KIND: names from the state dir named on the command line, if any
    local state=() i
    for ((i = 1; i < ${#COMP_WORDS[@]}; i++)); do
        [[ ${COMP_WORDS[i]} == --state-dir ]] && state=(--state-dir "${COMP_WORDS[i+1]}")
    done
    "${COMP_WORDS[0]}" "${state[@]}" completion names "$1" 2>/dev/null
}

_provisiond_reply() {  # WORDS CUR: COMPREPLY, the words starting with CUR (never globbed:
    COMPREPLY=()          # n[1-4] is a range, not a file name pattern; no compgen, whose
    local word glob=      # zsh emulation globs its words)
    case $- in *f*) ;; *) glob=1; set -f ;; esac
    for word in $1; do
        [[ $word == "$2"* ]] && COMPREPLY+=("$word")
    done
    [[ -n $glob ]] && set +f
    return 0
}

_provisiond_values() {  # KIND CUR: COMPREPLY for one value of that kind
    local list
    case $1 in
        files|dirs) COMPREPLY=() ;;  # `complete -o default`: the shell's own file names
        choice:*) list=${1#choice:}; _provisiond_reply "${list//,/ }" "$2" ;;
        nodes|profiles|images|overlays) _provisiond_reply "$(_provisiond_names "$1")" "$2" ;;
        *) COMPREPLY=() ;;
    esac
}

_provisiond() {  # (no variable named path or words: zsh's own)
    local cur=${COMP_WORDS[COMP_CWORD]} command=provisiond npos=0 i word kind
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if [[ $word == -* ]]; then
            [[ -n ${_provisiond_value[$command ${word%%=*}]+x} && $word != *=* ]] && ((i++))
        elif [[ " ${_provisiond_children[$command]} " == *" $word "* && $npos == 0 ]]; then
            command="$command $word"
        else
            ((npos++))
        fi
    done
    local prev=${COMP_WORDS[COMP_CWORD-1]}
    if ((COMP_CWORD > 1)) && [[ -n ${_provisiond_value[$command $prev]+x} ]]; then
        _provisiond_values "${_provisiond_value[$command $prev]}" "$cur"
    elif [[ $cur == -* ]]; then
        _provisiond_reply "${_provisiond_options[$command]}" "$cur"
    elif [[ -n ${_provisiond_children[$command]} && $npos == 0 ]]; then
        _provisiond_reply "${_provisiond_children[$command]}" "$cur"
    else
        local kinds=(${_provisiond_positional[$command]})
        if ((npos < ${#kinds[@]})); then
            kind=${kinds[npos]}
        elif ((${#kinds[@]})) && [[ ${kinds[-1]} == *+ ]]; then
            kind=${kinds[-1]}  # a positional taking several values
        else
            kind=-
        fi
        _provisiond_values "${kind%+}" "$cur"
    fi
}
complete -o default -F _provisiond provisiond
'''

ZSH_HEAD = """#compdef provisiond
# zsh runs the bash completion through bashcompinit (and compinit, if not loaded yet).
(( ${+functions[compdef]} )) || { autoload -U +X compinit && compinit -i; }
autoload -U +X bashcompinit && bashcompinit
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description="Print the completion script for bash or zsh, generated from this "
        "command's own parser: source it, e.g. `source <(provisiond completion bash)`, or "
        "save it as /etc/bash_completion.d/provisiond (bash) or as _provisiond in a "
        "$fpath directory (zsh). Node ranges, node, profile, image and overlay names are "
        "completed from the state directory (--state-dir on the line, else the default).")
    parser.add_argument("shell", choices=["bash", "zsh", "names"],
                        help="bash, zsh; `names KIND` lists names for the script")
    parser.add_argument("kind", nargs="?", choices=KINDS, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args, ctx) -> None:
    from provisiond.cli import build_parser

    if args.shell == "names":
        for name in names(ctx, args.kind or "nodes"):
            ctx.print_line(name)
        return
    script = bash_script(build_parser())
    print(ZSH_HEAD + script if args.shell == "zsh" else script, end="")


def bash_script(parser) -> str:
    """The bash completion: four tables of the command tree, then the functions using them."""
    children, options, values, positional = {}, {}, {}, {}
    for command in walk(parser):
        path = " ".join(("provisiond", *command.words))  # bash keys cannot be empty
        children[path] = " ".join(command.children)
        options[path] = " ".join(s for a in command.options for s in a.option_strings)
        for action in command.options:
            if takes_value(action):
                for flag in action.option_strings:
                    values[f"{path} {flag}"] = _value_kind(command, action)
        positional[path] = " ".join(_positional_kind(command, a) for a in command.positionals)
    lines = ["# provisiond completion for bash, generated by `provisiond completion bash`"]
    for name, table in (("children", children), ("options", options), ("value", values),
                        ("positional", positional)):
        lines.append(f"declare -gA _provisiond_{name}=(")
        lines += [f"    [{shlex.quote(k)}]={shlex.quote(v)}" for k, v in sorted(table.items())]
        lines.append(")")
    return "\n".join(lines) + "\n" + BASH_BODY


def _value_kind(command: Command, action) -> str:
    """files, dirs, nodes...; choice:a,b for a fixed set; - for free text."""
    if action.choices:
        return "choice:" + ",".join(str(c) for c in action.choices)
    if (command.words[:1] + (action.dest,)) in NOT_NAMES:
        return "-"
    return command.kind(action) or "-"


def _positional_kind(command: Command, action) -> str:
    return _value_kind(command, action) + ("+" if action.nargs in ("*", "+") else "")


def names(ctx, kind: str) -> list[str]:
    """The names completion offers; nothing (never an error) where there is no state."""
    from provisiond.errors import ProvisiondError

    try:
        return NAMERS[kind](ctx.config)
    except (ProvisiondError, OSError):
        return []


def _nodes(config) -> list[str]:
    from provisiond.inventory import InventoryStore
    from provisiond.inventory.model import node_sort_key
    from provisiond.inventory.ranges import fold

    found = sorted(InventoryStore(config).read().nodes, key=node_sort_key)
    return [*found, fold(found)] if len(found) > 1 else found


def _profiles(config) -> list[str]:
    from provisiond.inventory import InventoryStore

    return sorted(InventoryStore(config).read().profiles)


def _images(config) -> list[str]:
    from provisiond.images import list_images
    from provisiond.images.recipe import RECIPE_FILE
    from provisiond.state.layout import recipe_search_path

    recipes = {p.parent.name for folder in recipe_search_path(config) if folder.is_dir()
               for p in folder.glob(f"*/{RECIPE_FILE}")}
    return sorted(recipes | {m["name"] for m in list_images(config)})


def _overlays(config) -> list[str]:
    from provisiond.overlays import list_overlay_dirs

    return list(list_overlay_dirs(config))


NAMERS = {"nodes": _nodes, "profiles": _profiles, "images": _images, "overlays": _overlays}
