"""`provisiond doctor [RANGE]`: the preflight before a first boot (provisiond.preflight)."""

from __future__ import annotations

from provisiond.errors import ExitCode

COLUMNS = ["STATUS", "CHECK", "SUBJECT", "PROBLEM"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check the settings, ports, iPXE files, images, overlays and BMCs "
        "before nodes boot",
        description="Check what would stop a boot: settings; each listener's address (on "
        "this host) and port (free, or held by provisiond serve); dhcp.interface; the iPXE "
        "binaries in tftp.root; who owns the state directory; with dhcp.discovery and a "
        "discovery.pool, the discovery image built; for each node of RANGE "
        "(default all): a MAC and an address, its image built (blobs present) and its "
        "recipe unchanged since, its image's mounted layer blobs and boot kit (present, of "
        "the size and digest the manifest names; a failure only for a node that boots "
        "mounted; a warning when its kernel args ask provisiond.boot=mounted of an image that "
        "boots unpacked), its overlays built and current, and its BMC answering a "
        "power-state query (nothing is changed). Prints the problems with the fix for each "
        "(--all: every check). Exits 9 when something would stop a boot (a 'fail'); "
        "warnings alone exit 0. Run it as root to test ports below 1024, and in the network "
        "namespace serve runs in.")
    parser.add_argument("range", nargs="?", help="node range, e.g. n[001-128]; default all")
    parser.add_argument("--all", action="store_true", help="show the checks that passed too")
    parser.add_argument("--json", action="store_true", help="every check as a JSON list")
    parser.add_argument("--no-bmc", action="store_true", help="do not contact the BMCs")
    parser.add_argument("--bmc-timeout", type=float, default=3.0, metavar="SECONDS",
                        help="seconds per BMC (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args, ctx) -> int:
    from provisiond.errors import InvalidInput
    from provisiond.preflight import run_checks

    if not 0 < args.bmc_timeout <= 600:
        raise InvalidInput(f"--bmc-timeout: {args.bmc_timeout} is outside (0, 600] seconds")
    findings = run_checks(ctx.config, args.range, not args.no_bmc, args.bmc_timeout)
    if args.json:
        ctx.print_json([f.to_data() for f in findings])
    else:
        _print(ctx, findings, args.all)
    failed = any(f.level == "fail" for f in findings)
    return ExitCode.PREFLIGHT_FAILED if failed else ExitCode.OK


def _print(ctx, findings, every: bool) -> None:
    """A table (status, check, subject, problem), each problem's fix on the line below it:
    a fix is never cut to fit the terminal."""
    shown = [f for f in findings if every or f.level != "ok"]
    widths = [max([len(c), *(len(v) for v in values)]) for c, values in zip(
        COLUMNS[:3], zip(*[(f.level.upper(), f.check, f.subject) for f in shown]))] \
        if shown else []
    if shown:
        ctx.print_line(_row(COLUMNS[:4], widths))
    for f in shown:
        ctx.print_line(_row([f.level.upper(), f.check, f.subject, f.detail], widths))
        if f.fix:
            ctx.print_line(" " * (sum(widths) + 6) + f"fix: {f.fix}")
    counts = {level: sum(f.level == level for f in findings) for level in ("fail", "warn")}
    ctx.print_line(f"{len(findings)} checks: {counts['fail']} failed, {counts['warn']} "
                   f"warning(s)" + ("" if counts["fail"] else "; nothing stops a boot"))


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join([*(c.ljust(w) for c, w in zip(cells, widths)), cells[3]]).rstrip()
