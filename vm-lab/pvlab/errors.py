"""The lab's errors: one subclass of provisiond's root, so callers catch one thing."""

from provisiond.errors import ExitCode, ProvisiondError


class LabError(ProvisiondError):
    """The lab could not be brought up, driven or torn down."""

    exit_code = ExitCode.SERVE_FAILED
