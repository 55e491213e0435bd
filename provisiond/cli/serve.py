"""`provisiond serve`: run the boot services (HTTP, DHCP, TFTP, DNS) the config enables."""

from __future__ import annotations

import argparse

SERVICES = ("http", "dhcp", "tftp", "dns")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the boot services (HTTP, DHCP, TFTP, DNS)",
        description="Run the boot services that provisiond.yaml enables; --X/--no-X override "
        "one service. A bad setting stops it before anything starts. inventory.yaml is "
        "reloaded when it changes; an invalid one (or one gone missing or empty) is logged and "
        "the last good one kept (none at start: no node is served until the file is fixed). "
        "A port in use is named in one line. Stops cleanly on SIGTERM.")
    for name in SERVICES:
        parser.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                            help=f"run the {name.upper()} server (default: {name}.enabled)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"])
    parser.set_defaults(func=handler)


def handler(args, ctx) -> int:
    from provisiond.boot.logs import setup_logging
    from provisiond.boot.supervisor import serve

    setup_logging(args.log_level)
    config = ctx.config
    enabled = {name: getattr(config, name).enabled if getattr(args, name) is None
               else getattr(args, name) for name in SERVICES}
    return serve(config, enabled)
