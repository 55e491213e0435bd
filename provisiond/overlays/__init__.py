"""Overlays: Jinja2-templated directory trees rendered per node and packed as cpio.

System overlays go into the node's boot (never secrets); runtime overlays may hold per-node
secrets and are served only to that node. See provisiond/shipped/overlays/README.md for the
template context.
"""

from provisiond.overlays.batch import OverlayBuildFailed, build_overlays
from provisiond.overlays.build import ensure_overlay
from provisiond.overlays.source import list_overlay_dirs, load_overlay
from provisiond.overlays.templates import OverlayTemplateError

__all__ = ["ensure_overlay", "build_overlays", "load_overlay", "list_overlay_dirs",
           "OverlayBuildFailed", "OverlayTemplateError"]
