"""Which routes each HTTP listener answers when the API has one of its own (`api.bind`).

The boot listener, on the boot network, answers only what nodes fetch: iPXE scripts, boot
files, blobs, overlays and their own status reports. The API listener (a management
network, TLS when configured) answers everything else: /api/v1, /metrics, the status page.
With `api.bind` unset one listener answers both ("all"). A route nodes need (a new
node-facing endpoint) must be named in BOOT_ROUTES, or nodes on the boot network lose it.
"""

from __future__ import annotations

from flask import current_app, request

from provisiond.errors import NotFound

BOOT_PREFIXES = ("/boot/", "/blobs/", "/overlays/")
# (method, path prefix) of the node-facing routes outside BOOT_PREFIXES.
BOOT_ROUTES = (("POST", "/api/v1/status/"),)


def is_boot_route(method: str, path: str) -> bool:
    """Whether nodes on the boot network use this route."""
    return path.startswith(BOOT_PREFIXES) or any(
        method == m and path.startswith(prefix) for m, prefix in BOOT_ROUTES)


def refuse_other_listeners_routes() -> None:
    """A Flask before_request hook: a route of the other listener is 404, naming where it is."""
    listener = current_app.config["PROVISIOND_LISTENER"]
    if listener == "all":
        return
    boot = is_boot_route(request.method, request.path)
    if listener == "boot" and not boot:
        api = current_app.config["PROVISIOND"].api.url
        raise NotFound(f"{request.path[:200]} is not served on the boot network; the API "
                       f"listens on {api}")
    if listener == "api" and boot and not request.path.startswith("/api/"):
        raise NotFound(f"{request.path[:200]} is served to nodes on the boot listener only")
