"""`provisiond overlay`: list, show, render one file for a node, build nodes' overlays."""

from __future__ import annotations

import sys

from provisiond import overlays
from provisiond.errors import InvalidInput, NodeNotFound
from provisiond.inventory.ranges import expand
from provisiond.overlays.context import take_snapshot
from provisiond.overlays.render import Builder


def register(subparsers) -> None:
    parser = subparsers.add_parser("overlay", help="list, inspect, render and build overlays")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="overlays on the search path (site ones shadow "
                               "shipped ones)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="an overlay's files, templates and origin")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    render = verbs.add_parser("render", help="print one file of an overlay as rendered for "
                              "a node (secrets are shown as placeholders)")
    render.add_argument("node")
    render.add_argument("name")
    render.add_argument("path", help="the file's path on the node, e.g. /etc/hosts")
    render.set_defaults(func=cmd_render)
    build = verbs.add_parser("build", help="build nodes' overlays (only what changed)")
    build.add_argument("range", nargs="?", help="node range, e.g. n[001-128]; default all")
    build.add_argument("--json", action="store_true", help="print the summary as JSON")
    build.set_defaults(func=cmd_build)


def cmd_list(args, ctx) -> int:
    rows, data = [], []
    for name, (root, shadowed) in overlays.list_overlay_dirs(ctx.config).items():
        overlay = overlays.load_overlay(ctx.config, name)
        templates = sum(f.kind == "template" for f in overlay.files)
        files = sum(f.kind != "dir" for f in overlay.files)
        kind = "runtime only" if overlay.secret else "any"
        data.append({"name": name, "path": str(root), "shadows": [str(p) for p in shadowed],
                     "files": files, "templates": templates, "kind": kind,
                     "description": overlay.description})
        rows.append([name, files, templates, kind, str(root), overlay.description])
    if args.json:
        ctx.print_json(data)
    else:
        ctx.print_table(["NAME", "FILES", "TEMPLATES", "USE", "PATH", "DESCRIPTION"], rows)
    return 0


def cmd_show(args, ctx) -> int:
    overlay = overlays.load_overlay(ctx.config, args.name)
    _, shadowed = overlays.list_overlay_dirs(ctx.config).get(args.name, (None, []))
    files = [{"path": "/" + f.target, "kind": f.kind, "mode": f"{f.mode:04o}",
              "source": f.rel} for f in overlay.files]
    if args.json:
        ctx.print_json({"name": overlay.name, "path": str(overlay.root),
                        "shadows": [str(p) for p in shadowed], "secret": overlay.secret,
                        "variables": sorted(overlay.uses), "description": overlay.description,
                        "files": files})
        return 0
    ctx.print_line(f"{overlay.name}: {overlay.root}" + (" (runtime only: holds secrets)"
                                               if overlay.secret else ""))
    for path in shadowed:
        ctx.print_line(f"  shadows {path}")
    if overlay.uses:
        ctx.print_line(f"  templates use: {', '.join(sorted(overlay.uses))}")
    ctx.print_table(["PATH", "KIND", "MODE", "SOURCE"],
                    [[f["path"], f["kind"], f["mode"], f["source"]] for f in files])
    return 0


def cmd_render(args, ctx) -> int:
    snapshot = take_snapshot(ctx.config)
    if args.node not in snapshot.nodes:
        raise NodeNotFound(f"no node named {args.node!r}")
    overlay = overlays.load_overlay(ctx.config, args.name)
    builder = RedactingBuilder(ctx.config, snapshot)
    kind = "runtime" if overlay.secret else "system"
    wanted = args.path.strip("/")
    for entry in builder.render(overlay, args.node, kind):
        if entry.path == wanted and not entry.is_dir:
            sys.stdout.write(entry.data.decode(errors="replace"))
            return 0
    raise InvalidInput(f"overlay {args.name} has no file {args.path} for node {args.node}")


class RedactingBuilder(Builder):
    """A builder whose secrets are placeholders, for showing rendered files to people."""

    def secrets(self, node: str) -> tuple[dict, str]:
        data, digest = super().secrets(node)
        return _redact(data, "secrets"), digest


def _redact(value, path: str):
    if isinstance(value, dict):
        return {k: _redact(v, f"{path}.{k}") for k, v in value.items()}
    return f"<{path}>"


def cmd_build(args, ctx) -> int:
    names = expand(args.range) if args.range else None
    progress = _Progress() if sys.stderr.isatty() and not args.json else None
    try:
        summary = overlays.build_overlays(ctx.config, names, progress=progress)
    finally:
        progress and progress.close()
    if args.json:
        ctx.print_json(summary)
        return 0
    for kind in summary["rebuilt"]:
        print(f"{kind}: {summary['rebuilt'][kind]} rebuilt, {summary['reused'][kind]} "
              "reused")
    print(f"{summary['nodes']} nodes in {summary['seconds']:.2f}s (inventory "
          f"{summary['inventory_seconds']:.2f}s)")
    return 0


class _Progress:
    """`overlays: 1200/10000 nodes` redrawn in place on stderr."""

    def __call__(self, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\roverlays [{'#' * filled}{'.' * (width - filled)}] "
                         f"{done}/{total} nodes")
        sys.stderr.flush()

    @staticmethod
    def close() -> None:
        sys.stderr.write("\n")
