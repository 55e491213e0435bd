"""The one exception root of provisiond, its named subclasses, and the CLI's exit codes.

Every error a user can cause or meet is a ProvisiondError; the CLI prints it as one line and
exits with its `exit_code` (one ExitCode per kind of failure, the table `--help` and README
show), the API maps it to a JSON body and the status code named by `http_status`.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    """What the `provisiond` command's exit status means; EXIT_CODE_MEANINGS says it in words."""

    OK = 0
    FAILED = 1
    INVALID_INPUT = 2
    NOT_FOUND = 3
    CONFLICT = 4
    BUILD_FAILED = 5
    FORBIDDEN = 6
    BMC_FAILED = 7
    SERVE_FAILED = 8
    PREFLIGHT_FAILED = 9
    INTERRUPTED = 130
    STDOUT_CLOSED = 141


EXIT_CODE_MEANINGS = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "any other failure (e.g. a file that cannot be read or written)",
    ExitCode.INVALID_INPUT: "invalid input: a usage error, a bad value in a flag, a file or "
                            "provisiond.yaml, or a change the inventory would not accept; "
                            "nothing was written",
    ExitCode.NOT_FOUND: "not found: a node, profile, image, overlay, or no state directory "
                        "(run `provisiond init`)",
    ExitCode.CONFLICT: "conflict: it exists already, is in use, or the inventory changed "
                       "meanwhile",
    ExitCode.BUILD_FAILED: "an image or overlay build failed; the previous build stays",
    ExitCode.FORBIDDEN: "forbidden: not allowed to see or do this",
    ExitCode.BMC_FAILED: "a BMC failed or did not answer for at least one node (power, "
                         "bootdev, firmware, slurm); the others were done",
    ExitCode.SERVE_FAILED: "serve: a boot service could not start",
    ExitCode.PREFLIGHT_FAILED: "doctor: a check found something that would stop a boot",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C; SIGTERM or a hangup too, during an image "
                          "build, import or shell)",
    ExitCode.STDOUT_CLOSED: "the reader closed the output early (piped into head): the "
                            "command ends quietly, as one that SIGPIPE ends",
}


def exit_code_table() -> list[tuple[int, str]]:
    """(code, meaning) rows in code order, for `--help` and README."""
    return [(int(code), EXIT_CODE_MEANINGS[code]) for code in ExitCode]


class ProvisiondError(Exception):
    """Root of every error provisiond reports to a user. `code` is the API's stable slug for
    it; `field` (optional) names the input field at fault, dotted (netdevs.eth0.mac)."""

    http_status = 500
    exit_code = ExitCode.FAILED
    code = "internal"

    def __init__(self, *args, field: str | None = None):
        super().__init__(*args)
        self.field = field


class InvalidInput(ProvisiondError):
    """A request, a flag or a file holds a value that cannot be used."""

    code = "invalid_input"
    http_status = 400
    exit_code = ExitCode.INVALID_INPUT


class UnsupportedMediaType(InvalidInput):
    """A request body is not of a type the endpoint reads (JSON)."""

    code = "unsupported_media_type"
    http_status = 415


class TooLarge(InvalidInput):
    """A request body is larger than the server reads."""

    code = "too_large"
    http_status = 413


class InvalidInventory(InvalidInput):
    """A change would leave the inventory invalid; nothing was written."""

    code = "invalid_inventory"
    http_status = 422


class InvalidConfig(InvalidInput):
    """provisiond.yaml cannot be used."""

    code = "invalid_config"


class NotFound(ProvisiondError):
    """A named thing does not exist."""

    code = "not_found"
    http_status = 404
    exit_code = ExitCode.NOT_FOUND


class StateDirNotFound(NotFound):
    """The state directory holds no provisiond.yaml and no inventory."""


class NodeNotFound(NotFound):
    """No node matches the given name or range."""


class ProfileNotFound(NotFound):
    """No profile has the given name."""


class ImageNotFound(NotFound):
    """No built image has the given name."""


class OverlayNotFound(NotFound):
    """No overlay has the given name."""


class JobNotFound(NotFound):
    """No job has the given id (or it left the bounded history)."""


class SecretNotFound(NotFound):
    """None of the named records has the secret key to remove."""


class AlreadyExists(ProvisiondError):
    """A create would overwrite something that exists."""

    code = "already_exists"
    http_status = 409
    exit_code = ExitCode.CONFLICT


class Conflict(ProvisiondError):
    """The caller's view is stale or the thing is in use."""

    code = "conflict"
    http_status = 409
    exit_code = ExitCode.CONFLICT


class StaleRevision(Conflict):
    """A write named an inventory revision that is no longer current."""

    code = "stale_revision"


class InUse(Conflict):
    """A thing cannot be removed while others use it."""

    code = "in_use"


class BuildFailed(ProvisiondError):
    """An image or overlay build failed; the previous build stays in place."""

    code = "build_failed"
    exit_code = ExitCode.BUILD_FAILED


class Forbidden(ProvisiondError):
    """The caller may not see or do this."""

    code = "forbidden"
    http_status = 403
    exit_code = ExitCode.FORBIDDEN


class BmcError(ProvisiondError):
    """A BMC refused or failed a request."""

    code = "bmc_error"
    http_status = 502
    exit_code = ExitCode.BMC_FAILED


class BmcUnreachable(BmcError):
    """A BMC did not answer in time."""

    code = "bmc_unreachable"
    http_status = 504


class UnsupportedOperation(BmcError):
    """The driver or BMC cannot do what was asked."""

    code = "unsupported_operation"
    http_status = 501


class Unavailable(ProvisiondError):
    """The server cannot take this request now (a bound is reached); retry later."""

    code = "unavailable"
    http_status = 503


class TooManyRequests(ProvisiondError):
    """One client sent more than its share (a rate limit per address); retry later."""

    code = "too_many_requests"
    http_status = 429


class ServeFailed(ProvisiondError):
    """A boot service could not start (a port in use, a missing interface...)."""

    code = "serve_failed"
    exit_code = ExitCode.SERVE_FAILED


class Unauthenticated(ProvisiondError):
    """No, an unknown, an expired or a revoked API token or node credential."""

    code = "unauthenticated"
    http_status = 401
    exit_code = ExitCode.FORBIDDEN


class PreconditionFailed(ProvisiondError):
    """An If-Match named a version of the resource that is no longer current."""

    code = "precondition_failed"
    http_status = 412
    exit_code = ExitCode.CONFLICT
