"""Built images for the CLI and the API: list, show, delete (refused while nodes use the
image, unless forced). Builds are jobs (provisiond.jobs)."""

from __future__ import annotations

from provisiond import images
from provisiond.config import Config
from provisiond.errors import InUse
from provisiond.service.inventory import NODES, snapshot
from provisiond.service.journal import audit

__all__ = ["list_images", "show_image", "delete_image", "image_users"]


def list_images(config: Config) -> list[dict]:
    return images.list_images(config)


def show_image(config: Config, name: str) -> dict:
    return images.load_manifest(config, name)


def image_users(config: Config, name: str) -> list[str]:
    """The nodes whose merged record names image `name`, in name order."""
    view = snapshot(config)
    names, _ = view.sorted_names(NODES)
    return [n for n in names if view.merged(n).record.image == name]


def delete_image(config: Config, actor: str, name: str, force: bool = False) -> None:
    """Remove the image's manifest (its blobs go at the next gc); InUse while nodes use it,
    unless `force`."""
    images.load_manifest(config, name)
    users = image_users(config, name)
    if users and not force:
        shown = ", ".join(users[:5]) + (" ..." if len(users) > 5 else "")
        raise InUse(f"image {name} is used by {len(users)} node(s): {shown} (use --force "
                    "to delete anyway)")
    images.delete_image(config, name)
    audit(config, actor, "image.delete", f"image:{name}", ["manifest"])
