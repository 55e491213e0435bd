"""The Jinja2 environment of overlays: strict undefined, a few network filters, and errors
that name the overlay, the file, the line and the node."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import traceback
from pathlib import Path

from jinja2 import Environment, StrictUndefined, TemplateError, TemplateSyntaxError
from jinja2 import nodes as ast

from provisiond.config import CONTROL_RE
from provisiond.errors import BuildFailed

# A rendered template may hold several files: each starts at a line `#@file <relative path>`.
FILE_MARK = re.compile(r"^#@file[ \t]+(\S+)[ \t]*$", re.MULTILINE)


class OverlayTemplateError(BuildFailed):
    """An overlay template failed to compile or render; nothing was written."""


def prefixlen(netmask: str) -> int:
    """255.255.255.0 -> 24."""
    return ipaddress.IPv4Network(f"0.0.0.0/{netmask}").prefixlen


def hclquote(value) -> str:
    """A quoted HCL string: JSON escapes, and ${ or %{ kept from being interpolated."""
    return json.dumps(str(value), ensure_ascii=False).replace("${", "$${").replace("%{", "%%{")


def _make_environment() -> Environment:
    env = Environment(undefined=StrictUndefined, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["prefixlen"] = prefixlen
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["hclquote"] = hclquote
    return env


ENVIRONMENT = _make_environment()


def compile_template(overlay: str, rel: str, path: Path, data: bytes):
    """Compile once; a syntax error names the overlay, the file and the line."""
    try:
        code = ENVIRONMENT.compile(data.decode(), name=rel, filename=str(path))
    except TemplateSyntaxError as exc:
        raise OverlayTemplateError(
            f"overlay {overlay}, file {rel}, line {exc.lineno}: {exc.message}") from None
    except UnicodeDecodeError:
        raise OverlayTemplateError(f"overlay {overlay}, file {rel}: not UTF-8 text") from None
    return ENVIRONMENT.template_class.from_code(
        ENVIRONMENT, code, ENVIRONMENT.make_globals(None), None)


def render_template(template, context: dict, overlay: str, rel: str, node: str) -> str:
    """Render; any failure (a missing variable, a failing filter, a `#@file` name a node
    could not copy) is one error line."""
    try:
        text = template.render(context)
    except Exception as exc:  # noqa: BLE001 - every template failure is reported the same way
        error = exc
    else:
        _check_file_marks(text, overlay, rel, node)
        return text
    message = error.message if isinstance(error, TemplateError) and error.message else \
        f"{type(error).__name__}: {error}"
    message = _without_secrets(message, context.get("secrets"))
    line = _template_line(error, template.filename)
    where = f", line {line}" if line else ""
    raise OverlayTemplateError(f"overlay {overlay}, file {rel}{where}, node {node}: {message}")


def _check_file_marks(text: str, overlay: str, rel: str, node: str) -> None:
    """The `#@file` names a rendering gives (node data may be in them) follow the rule of
    the overlay's own file names (provisiond.overlays.source), and stay in the template's
    folder: `../` put a file outside the overlay's copy on the node, another control
    character went into the archive as it was."""
    if "#@file" not in text:
        return
    for mark in FILE_MARK.finditer(text):
        name = mark.group(1).strip("/")
        parts = name.split("/")
        if CONTROL_RE.search(name):
            why = "a control character in it"
        elif not name or any(part in ("", ".", "..") for part in parts):
            why = "not a path below the template's folder"
        else:
            continue
        raise OverlayTemplateError(f"overlay {overlay}, file {rel}, node {node}: "
                                   f"`#@file {mark.group(1)!r}`: {why}")


def _without_secrets(message: str, secrets) -> str:
    """The message with every line of a secret blanked, as it is and as repr() shows it
    (a failing filter may quote its input; errors go to the CLI, the API and the server's
    log). Longest first, so that a line inside another goes with it."""
    for line in sorted(_secret_lines(secrets), key=len, reverse=True):
        for shown in (line, repr(line)[1:-1], line.replace("\\", "\\\\")):
            message = message.replace(shown, "<secret>")
    return message


SHORTEST_BLANKED = 4
"""Lines of a secret shorter than this (a JSON key file's "}") are left: they are in most
messages, and blanking them would leave nothing to read."""


def _secret_lines(secrets) -> set[str]:
    if isinstance(secrets, dict):
        return set().union(*(_secret_lines(value) for value in secrets.values()))
    if isinstance(secrets, str):
        return {line.strip() for line in secrets.splitlines()
                if len(line.strip()) >= SHORTEST_BLANKED}
    return set()


def _template_line(error: Exception, filename: str | None) -> int | None:
    """The template line where `error` arose (Jinja rewrites tracebacks to template lines)."""
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__)
             if f.filename == filename]
    return lines[-1] if lines else None


def split_files(target: str, text: str) -> list[tuple[str, str]]:
    """(path, text) pairs: one for a plain template, several where `#@file` lines appear."""
    marks = list(FILE_MARK.finditer(text))
    if not marks:
        return [(target, text)]
    folder = target.rsplit("/", 1)[0] + "/" if "/" in target else ""
    pieces = []
    for mark, following in zip(marks, [*marks[1:], None]):
        body = text[mark.end() + 1:following.start() if following else len(text)]
        pieces.append((folder + mark.group(1).strip("/"), body))
    return pieces


def fields_read(tree: ast.Template, variable: str) -> frozenset[str] | None:
    """The fields of `variable` a parsed template reads: `var.x`, `var["x"]` and anything
    below them (`var.x.y`, `var.x | sort`, a loop over `var.x`) give "x" (so `var.items()`
    gives "items": the caller treats a name it does not know as "all of it"). Any other use
    of `var` itself (passed whole to a filter or a test, iterated, aliased with `set`, or
    the name rebound by a loop or a macro) gives None: the template may read all of it."""
    fields: set[str] = set()
    for parent, child in _edges(tree):
        if not (isinstance(child, ast.Name) and child.name == variable):
            continue
        field = _field_of(parent, child)
        if field is None:
            return None
        fields.add(field)
    return frozenset(fields)


def reads_whole_context(tree: ast.Template) -> bool:
    """Whether the template may read variables without naming them: through `self` other
    than `self.<block>` (`self._TemplateReference__context[name]` is a known idiom for a
    variable looked up by name) or through a private attribute (`_x`, which `attr()` and
    `[...]` reach as well). The caller then takes it to read every variable whole."""
    for parent, child in _edges(tree):
        if isinstance(child, ast.Name) and child.name == "self" and child.ctx == "load" \
                and not _is_block_call(parent, child):
            return True
        if isinstance(child, ast.Getattr) and child.attr.startswith("_"):
            return True
        if isinstance(child, ast.Const) and isinstance(child.value, str) \
                and child.value.startswith("_") and _is_lookup(parent):
            return True
    return False


def _is_lookup(parent: ast.Node | None) -> bool:
    """Whether a constant under `parent` is looked up: `x["_a"]` or `x | attr("_a")`."""
    return isinstance(parent, ast.Getitem) or \
        (isinstance(parent, ast.Filter) and parent.name == "attr")


def _is_block_call(parent: ast.Node | None, name: ast.Name) -> bool:
    """`self.<block>`: the only use of `self` that reads no variable it does not name."""
    return isinstance(parent, ast.Getattr) and parent.node is name \
        and not parent.attr.startswith("_")


def _edges(node: ast.Node, parent: ast.Node | None = None):
    """(parent, child) for every node of the tree."""
    yield parent, node
    for child in node.iter_child_nodes():
        yield from _edges(child, node)


def _field_of(parent: ast.Node | None, name: ast.Name) -> str | None:
    """The field read when `name` is the object of `parent`, else None."""
    if name.ctx != "load" or parent is None or getattr(parent, "node", None) is not name:
        return None
    if isinstance(parent, ast.Getattr):
        return parent.attr
    if isinstance(parent, ast.Getitem) and isinstance(parent.arg, ast.Const) \
            and isinstance(parent.arg.value, str):
        return parent.arg.value
    return None
