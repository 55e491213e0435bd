"""`provisiond power ACTION RANGE`, `provisiond bootdev DEVICE RANGE` and `provisiond node
reprovision RANGE`: fan-out to BMCs. Each runs as a job in this process (provisiond.jobs
run_here): the same checks, claims, audit record and `job.*` events as the API's jobs."""

from __future__ import annotations

from provisiond import jobs
from provisiond.audit import cli_actor
from provisiond.jobs.model import POWER_STATUS, Job
from provisiond.power import operations
from provisiond.power.fanout import NodeResult
from provisiond.power.progress import ProgressBar
from provisiond.power.report import print_results
from provisiond.power.reprovision import DEFAULT_TIMEOUT as REPROVISION_TIMEOUT
from provisiond.states import BootDevice, JobKind, PowerAction

STATUS = POWER_STATUS
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


def run_job_and_print(args, ctx, kind: JobKind, params: dict, label: str) -> int:
    """Run a `kind` job over args.range here, with a progress bar; print its results."""
    total = len(operations.select_nodes(ctx.config, args.range))
    job = jobs.run_here(ctx.config, kind, [args.range], params, cli_actor(),
                        ProgressBar(total, label))
    return print_results(ctx, node_results(job), args.json)


def node_results(job: Job) -> list[NodeResult]:
    """The ended job's per-node results, as the fan-out's tables print them."""
    return [NodeResult(r.name, r.result == "ok", r.detail, seconds=r.seconds)
            for r in job.results]


def power_handler(args, ctx) -> int:
    action = STATUS if args.action is None else args.action.value
    return run_job_and_print(args, ctx, JobKind.POWER,
                             {"action": action, "timeout": args.timeout}, f"power {args.verb}")


def bootdev_handler(args, ctx) -> int:
    params = {"device": args.device.value, "persistent": args.persistent, "uefi": args.uefi,
              "timeout": args.timeout}
    return run_job_and_print(args, ctx, JobKind.BOOTDEV, params, f"bootdev {args.verb}")


def settle_handler(args, ctx) -> int:
    return run_and_print(args, ctx, operations.settle_boot_device(ctx.config), "settle")


def add_reprovision_parser(node_subparsers):
    """Add `node reprovision RANGE` to the `node` noun's subparsers."""
    parser = node_subparsers.add_parser(
        "reprovision", help="PXE boot once, power cycle, wait until the nodes are ready",
        description="Set the next boot to PXE, power cycle, and wait until every node "
        "reports ready from the new boot. Exits non-zero if any node is not ready in time.")
    parser.add_argument("range", metavar="RANGE", help="nodes, e.g. n[001-008]")
    parser.add_argument("--timeout", type=float, default=REPROVISION_TIMEOUT,
                        metavar="SECONDS",
                        help=f"how long to wait for ready (default {REPROVISION_TIMEOUT:g})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=reprovision_handler)
    return parser


def reprovision_handler(args, ctx) -> int:
    return run_job_and_print(args, ctx, JobKind.REPROVISION, {"timeout": args.timeout},
                             "reprovision")
