"""The one exception root of provisiond and its named subclasses.

Every error a user can cause or meet is a ProvisiondError; the CLI prints it as one line and
exits non-zero, the API maps it to a JSON body and the status code named by `http_status`.
"""


class ProvisiondError(Exception):
    """Root of every error provisiond reports to a user."""

    http_status = 500
    exit_code = 1


class InvalidInput(ProvisiondError):
    """A request, a flag or a file holds a value that cannot be used."""

    http_status = 400
    exit_code = 2


class InvalidInventory(InvalidInput):
    """A change would leave the inventory invalid; nothing was written."""

    http_status = 422


class InvalidConfig(InvalidInput):
    """provisiond.yaml cannot be used."""


class NotFound(ProvisiondError):
    """A named thing does not exist."""

    http_status = 404
    exit_code = 3


class NodeNotFound(NotFound):
    """No node matches the given name or range."""


class ProfileNotFound(NotFound):
    """No profile has the given name."""


class ImageNotFound(NotFound):
    """No built image has the given name."""


class OverlayNotFound(NotFound):
    """No overlay has the given name."""


class AlreadyExists(ProvisiondError):
    """A create would overwrite something that exists."""

    http_status = 409
    exit_code = 4


class Conflict(ProvisiondError):
    """The caller's view is stale or the thing is in use."""

    http_status = 409
    exit_code = 4


class StaleRevision(Conflict):
    """A write named an inventory revision that is no longer current."""


class InUse(Conflict):
    """A thing cannot be removed while others use it."""


class BuildFailed(ProvisiondError):
    """An image or overlay build failed; the previous build stays in place."""

    exit_code = 5


class Forbidden(ProvisiondError):
    """The caller may not see or do this."""

    http_status = 403
    exit_code = 6


class BmcError(ProvisiondError):
    """A BMC refused or failed a request."""

    http_status = 502
    exit_code = 7


class BmcUnreachable(BmcError):
    """A BMC did not answer in time."""

    http_status = 504


class UnsupportedOperation(BmcError):
    """The driver or BMC cannot do what was asked."""

    http_status = 501
