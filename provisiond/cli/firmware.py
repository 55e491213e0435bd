"""`provisiond firmware list|update RANGE`: firmware inventory and updates through BMCs."""

from __future__ import annotations

from provisiond.cli.power import add_range_command, run_and_print, run_job_and_print
from provisiond.power import operations
from provisiond.power.firmware_url import (check_firmware_url, user_without_password,
                                          with_password, without_credentials)
from provisiond.states import JobKind

COLUMNS = ["NODE", "RESULT", "COMPONENT", "VERSION"]


def register(subparsers) -> None:
    firmware = subparsers.add_parser("firmware", help="list or update firmware through BMCs")
    verbs = firmware.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_range_command(verbs, "list", "list firmware components and versions").set_defaults(
        func=list_handler)
    update = add_range_command(
        verbs, "update", "have each BMC fetch an image by URL and apply it (Redfish "
        "SimpleUpdate), following the task to its end", default_timeout=f"{operations.FIRMWARE_UPDATE_TIMEOUT:g}")
    update.add_argument("--image", required=True, metavar="URL",
                        help="http(s) URL of the firmware image, reachable by the BMCs; "
                             "https://USER@host/... with --image-password-stdin for a "
                             "server that wants a login (a password given in the URL here "
                             "shows in `ps`)")
    update.add_argument("--image-password-stdin", action="store_true",
                        help="read the password of the URL's USER from standard input (asked "
                             "for at a terminal); the BMC gets it in the URL, no job record "
                             "or output shows it")
    update.set_defaults(func=update_handler)


def list_handler(args, ctx) -> int:
    return run_and_print(args, ctx, operations.firmware_list, "firmware list",
                         rows=_firmware_rows, columns=COLUMNS)


def update_handler(args, ctx) -> int:
    image = args.image
    if args.image_password_stdin:  # the URL's checks first: nothing asked for in vain
        check_firmware_url(image)
        user = user_without_password(image)
        password = ctx.read_secret(f"password of {user} for {without_credentials(image)}")
        image = with_password(image, password)
    params = {"image": image, "timeout": args.timeout or operations.FIRMWARE_UPDATE_TIMEOUT}
    return run_job_and_print(args, ctx, JobKind.FIRMWARE_UPDATE, params, "firmware update")


def _firmware_rows(result) -> list[list]:
    if not result.ok:
        return [[result.node, "error", "-", result.detail]]
    return [[result.node, "ok", c["name"], c["version"]] for c in result.value]
