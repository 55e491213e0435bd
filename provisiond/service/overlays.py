"""Overlays for the CLI and the API: the ones on the search path, one overlay's files, and
one file rendered for one node with its secrets shown as placeholders. Builds are jobs."""

from __future__ import annotations

from provisiond import overlays
from provisiond.config import Config
from provisiond.errors import InvalidInput, NodeNotFound, ProvisiondError
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.hostkeys import host_key_types
from provisiond.overlays.render import Builder

__all__ = ["list_overlays", "show_overlay", "render_file"]


def list_overlays(config: Config) -> list[dict]:
    """Each overlay on the search path: where it is, what it shadows, its files; one that
    cannot be read (overlay.yaml, a template, a file name) is listed with its one-line
    `error` (and no files, templates, kind or description), the others as ever."""
    found = []
    for name, (root, shadowed) in overlays.list_overlay_dirs(config).items():
        listed = {"name": name, "path": str(root), "shadows": [str(p) for p in shadowed]}
        try:
            overlay = overlays.load_overlay(config, name)
        except (ProvisiondError, OSError) as exc:
            found.append({**listed, "files": None, "templates": None, "kind": None,
                          "description": None, "error": _error_text(exc)})
            continue
        found.append({**listed, "files": sum(f.kind != "dir" for f in overlay.files),
                      "templates": sum(f.kind == "template" for f in overlay.files),
                      "kind": "runtime only" if overlay.runtime_only else "any",
                      "description": overlay.description, "error": None})
    return found


def _error_text(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    return str(exc)


def show_overlay(config: Config, name: str) -> dict:
    overlay = overlays.load_overlay(config, name)
    _, shadowed = overlays.list_overlay_dirs(config).get(name, (None, []))
    return {"name": overlay.name, "path": str(overlay.root),
            "shadows": [str(p) for p in shadowed], "secret": overlay.runtime_only,
            "variables": sorted(overlay.uses), "description": overlay.description,
            "files": [{"path": "/" + f.target, "kind": f.kind, "mode": f"{f.mode:04o}",
                       "source": f.rel} for f in overlay.files]}


def render_file(config: Config, node: str, name: str, path: str) -> bytes:
    """File `path` of overlay `name` as rendered for `node`, secrets as placeholders."""
    snapshot = take_snapshot(config)
    if node not in snapshot.nodes:
        raise NodeNotFound(f"no node named {node!r}")
    overlay = overlays.load_overlay(config, name)
    builder = RedactingBuilder(config, snapshot)
    wanted = path.strip("/")
    for entry in builder.render(overlay, node, "runtime" if overlay.runtime_only else "system"):
        if entry.path == wanted and not entry.is_dir:
            return entry.data
    raise InvalidInput(f"overlay {name} has no file {path} for node {node}", field="path")


class RedactingBuilder(Builder):
    """A builder whose secrets are placeholders, for showing rendered files to people. It
    makes no key: a reader's GET wrote a node's private host keys (RSA ones cost up to a
    second each)."""

    def secrets(self, node: str) -> tuple[dict, str]:
        keys = {t: {"private": None, "public": None}
                for t in host_key_types(self.config, node)}
        found = {**self.stored_secrets(node), "ssh_host_keys": keys}
        return _redact(found, "secrets"), "redacted"


def _redact(value, path: str):
    if isinstance(value, dict):
        return {k: _redact(v, f"{path}.{k}") for k, v in value.items()}
    return f"<{path}>"
