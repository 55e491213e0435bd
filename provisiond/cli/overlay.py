"""`provisiond overlay`: list, show, render one file for a node, build nodes' overlays."""

from __future__ import annotations

import sys

from provisiond import overlays
from provisiond.errors import ExitCode
from provisiond.inventory.ranges import expand
from provisiond.service.overlays import list_overlays, render_file, show_overlay


def register(subparsers) -> None:
    parser = subparsers.add_parser("overlay", help="list, inspect, render and build overlays")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="overlays on the search path (site ones shadow "
                               "shipped ones; one that cannot be read is listed with its "
                               "error, and the exit is 2)")
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
    """Every overlay; one that cannot be read is a row (USE `broken`) and its error line on
    stderr, and the exit is 2 (invalid input), as the power verbs list every node and exit
    non-zero when one failed."""
    data = list_overlays(ctx.config)
    if args.json:
        ctx.print_json(data)
    else:
        ctx.print_table(["NAME", "FILES", "TEMPLATES", "USE", "PATH", "DESCRIPTION"],
                        [[o["name"], o["files"], o["templates"], o["kind"] or "broken",
                          o["path"], o["description"] or o["error"]] for o in data])
    broken = [o for o in data if o["error"]]
    for overlay in broken:
        ctx.print_line(f"provisiond: error: overlay {overlay['name']}: {overlay['error']}",
                       file=sys.stderr)
    return ExitCode.INVALID_INPUT if broken else 0


def cmd_show(args, ctx) -> int:
    data = show_overlay(ctx.config, args.name)
    if args.json:
        ctx.print_json(data)
        return 0
    ctx.print_line(f"{data['name']}: {data['path']}" + (" (runtime only: holds secrets)"
                                                      if data["secret"] else ""))
    for path in data["shadows"]:
        ctx.print_line(f"  shadows {path}")
    if data["variables"]:
        ctx.print_line(f"  templates use: {', '.join(data['variables'])}")
    ctx.print_table(["PATH", "KIND", "MODE", "SOURCE"],
                    [[f["path"], f["kind"], f["mode"], f["source"]] for f in data["files"]])
    return 0


def cmd_render(args, ctx) -> int:
    data = render_file(ctx.config, args.node, args.name, args.path)
    sys.stdout.write(data.decode(errors="replace"))
    return 0


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
