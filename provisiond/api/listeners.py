"""Which routes each HTTP listener answers when the API has one of its own (`api.bind`).

The boot listener, on the boot network, answers only what nodes fetch: iPXE scripts, boot
files, blobs, overlays and their own status reports. The API listener (a management
network, TLS when configured) answers everything else: /api/v1, /metrics, the status page.
With `api.bind` unset one listener answers both ("all"). An /api/v1 route nodes call
while they boot (the credential exchange, status reports) says so in its registration
(`route(..., nodes=True)`), and the boot listener answers it.
"""

from __future__ import annotations

from flask import current_app, request

from provisiond.errors import NotFound

BOOT_PREFIXES = ("/boot/", "/blobs/", "/overlays/")


def is_boot_route(path: str, endpoint: str | None) -> bool:
    """Whether nodes on the boot network use this route (`endpoint`: Flask's, None when
    no route matched)."""
    from provisiond.api.v1 import node_endpoints

    return path.startswith(BOOT_PREFIXES) or endpoint in node_endpoints()


def refuse_other_listeners_routes() -> None:
    """A Flask before_request hook: a route of the other listener is 404, naming where it is."""
    listener = current_app.config["PROVISIOND_LISTENER"]
    if listener == "all":
        return
    boot = is_boot_route(request.path, request.endpoint)
    if listener == "boot" and not boot:
        api = current_app.config["PROVISIOND"].api.url
        raise NotFound(f"{request.path[:200]} is not served on the boot network; the API "
                       f"listens on {api}")
    if listener == "api" and boot and not request.path.startswith("/api/"):
        raise NotFound(f"{request.path[:200]} is served to nodes on the boot listener only")
