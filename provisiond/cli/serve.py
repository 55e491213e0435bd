"""`provisiond serve`: run the boot services (HTTP, DHCP, TFTP, DNS) the config enables."""

from __future__ import annotations

import argparse

from provisiond.boot.logs import FORMATS, LEVELS

SERVICES = ("http", "dhcp", "tftp", "dns")  # as provisiond.boot.supervisor.SERVICES


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the boot services (HTTP, DHCP, TFTP, DNS) and the API",
        description="Run the boot services that provisiond.yaml enables; --X/--no-X override "
        "one service. With api.bind set, the API (/api/v1) gets an HTTP listener of its own "
        "there (TLS with api.tls_cert and api.tls_key), and the http listener answers only "
        "what nodes fetch. A bad setting stops it before anything starts. inventory.yaml is "
        "reloaded when it changes; an invalid one (or one gone missing or empty) is logged and "
        "the last good one kept (none at start: no node is served until the file is fixed). "
        "A port in use is named in one line. Logs go to stderr, one line per event (journald "
        "under systemd). Stops cleanly on SIGTERM. Needs no root: the systemd unit runs it "
        "as an unprivileged user with CAP_NET_BIND_SERVICE for ports below 1024.")
    for name in SERVICES:
        parser.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                            help=f"run the {name.upper()} server (default: {name}.enabled)")
    parser.add_argument("--api", action=argparse.BooleanOptionalAction, default=None,
                        help="run the API's own listener (default: when api.bind is set)")
    parser.add_argument("--log-level", choices=LEVELS, help="default: log.level")
    parser.add_argument("--log-format", choices=FORMATS,
                        help="text, or json (one object per line); default: log.format")
    parser.set_defaults(func=handler)


def handler(args, ctx) -> int:
    from provisiond.boot.logs import setup_logging
    from provisiond.boot.supervisor import enabled_services, serve
    from provisiond.errors import InvalidInput

    config = ctx.config
    log = config.log.model_copy(update={"level": args.log_level or config.log.level,
                                        "format": args.log_format or config.log.format})
    config = config.model_copy(update={"log": log})
    if args.api and config.api.bind is None:
        raise InvalidInput("--api: the API has no listener of its own until api.bind is set "
                           "in provisiond.yaml (it is served on the http listener)")
    setup_logging(log.level, log.format)
    flags = {name: getattr(args, name) for name in (*SERVICES, "api")}
    return serve(config, enabled_services(config, flags))
