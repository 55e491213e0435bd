"""`provisiond power ACTION RANGE` and `provisiond bootdev DEVICE RANGE`: fan-out to BMCs."""

from __future__ import annotations

from provisiond.power import operations
from provisiond.power.progress import ProgressBar
from provisiond.power.report import print_results
from provisiond.states import BootDevice, PowerAction

STATUS = "status"
SETTLE = "settle"


def register(subparsers) -> None:
    power = subparsers.add_parser("power", help="power nodes on/off/cycle through their BMCs")
    verbs = power.add_subparsers(dest="verb", metavar="ACTION", required=True)
    for action in PowerAction:
        add_range_command(verbs, action.value, f"power {action.value}").set_defaults(
            func=power_handler, action=action)
    add_range_command(verbs, STATUS, "show power state").set_defaults(
        func=power_handler, action=None)
    bootdev = subparsers.add_parser("bootdev", help="set the next boot device through BMCs")
    devices = bootdev.add_subparsers(dest="verb", metavar="DEVICE", required=True)
    for device in BootDevice:
        parser = add_range_command(devices, device.value, f"boot from {device.value} next")
        _add_boot_flags(parser)
        parser.set_defaults(func=bootdev_handler, device=device)
    add_range_command(devices, SETTLE, "reset pending persistent PXE overrides of ready nodes "
                      "(BMCs with bmc.boot_once: false) to disk").set_defaults(
        func=settle_handler)


def add_range_command(verbs, name: str, help_text: str, default_timeout: str = "the "
                      "node's bmc.timeout, else power.timeout"):
    """A RANGE command with --timeout and --json (shared with firmware)."""
    parser = verbs.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("range", metavar="RANGE", help="nodes, e.g. n[001-128]")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"per-BMC deadline (default: {default_timeout})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _add_boot_flags(parser) -> None:
    parser.add_argument("--persistent", action="store_true",
                        help="keep this device for every boot (default: next boot only)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--uefi", dest="uefi", action="store_true", default=None,
                      help="boot in UEFI mode")
    mode.add_argument("--legacy", dest="uefi", action="store_false",
                      help="boot in legacy BIOS mode")


def run_and_print(args, ctx, operation, label: str, **table) -> int:
    """Fan `operation` out over args.range with a progress bar; print the results."""
    total = len(operations.select_nodes(ctx.config, args.range))
    results = operations.run(ctx.config, args.range, operation, args.timeout,
                             ProgressBar(total, label))
    return print_results(ctx, results, args.json, **table)


def power_handler(args, ctx) -> int:
    if args.action is None:
        return run_and_print(args, ctx, operations.power_status, "power status")
    return run_and_print(args, ctx, operations.power(args.action), f"power {args.verb}")


def bootdev_handler(args, ctx) -> int:
    operation = operations.boot_device(ctx.config, args.device, args.persistent, args.uefi)
    return run_and_print(args, ctx, operation, f"bootdev {args.verb}")


def settle_handler(args, ctx) -> int:
    return run_and_print(args, ctx, operations.settle_boot_device(ctx.config), "settle")
