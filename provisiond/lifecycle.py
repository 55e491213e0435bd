"""A node's life beyond its inventory record: what a stored record may name (images and
overlays that exist), and everything a deleted node leaves behind (secrets, ssh host keys,
credentials, overlay builds, status). The CLI and the API both go through here."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

from provisiond.config import Config
from provisiond.discovery.facts import forget_facts
from provisiond.errors import InvalidInput, InvalidInventory, NotFound
from provisiond.images.manifests import image_exists
from provisiond.images.recipe import find_recipe
from provisiond.inventory.model import Inventory
from provisiond.inventory.secrets import SecretStore
from provisiond.inventory.store import InventoryStore
from provisiond.overlays.build import node_dir
from provisiond.overlays.hostkeys import forget_host_keys, rotate_host_keys
from provisiond.overlays.source import find_overlay_dir
from provisiond.status import clear_status
from provisiond.trust import forget as forget_credentials


@contextlib.contextmanager
def edit_inventory(config: Config, expected_revision: int | None = None,
                   write: bool = True) -> Iterator[Inventory]:
    """InventoryStore.edit_records (records are replaced, never changed in place), with
    the records that changed checked against what exists."""
    check = lambda draft, changed: check_references(config, draft, changed)  # noqa: E731
    with InventoryStore(config).edit_records(expected_revision, write=write,
                                             check=check) as draft:
        yield draft


def check_references(config: Config, inventory: Inventory, changed: list[tuple[str, str]]
                     ) -> None:
    """Each changed record's image has a recipe or a build, each of its overlays exists
    (shipped or site). Records left alone are not checked: a removed recipe must not block
    every later edit, the deletion of its users included."""
    images: dict[str, str | None] = {}
    overlays: dict[str, str | None] = {}
    for kind, name in changed:
        record = getattr(inventory, kind)[name]
        where = f"{kind[:-1]} {name}"
        if record.image:
            _raise(where, "image", images.setdefault(
                record.image, _image_problem(config, record.image)))
        for field in ("system_overlays", "runtime_overlays"):
            for overlay in getattr(record, field) or []:
                _raise(where, field, overlays.setdefault(
                    overlay, _overlay_problem(config, overlay)))


def _raise(where: str, field: str, problem: str | None) -> None:
    if problem:
        raise InvalidInventory(f"{where}: {field}: {problem}")


def _image_problem(config: Config, name: str) -> str | None:
    try:
        find_recipe(config, name)
        return None
    except NotFound:
        pass
    if image_exists(config, name):
        return None
    return f"no recipe and no built image named {name!r} (see `provisiond image list`)"


def _overlay_problem(config: Config, name: str) -> str | None:
    try:
        find_overlay_dir(config, name)
        return None
    except NotFound as exc:
        return str(exc)


def check_forgettable(config: Config) -> None:
    """Before records are deleted: the secrets file they may own must be readable (else
    the records would go, their BMC passwords stay, and a new node of the same name would
    inherit one). Raises InvalidInput naming the file."""
    SecretStore(config).read()


def forget_nodes(config: Config, names: list[str]) -> None:
    """Remove everything the named (deleted) nodes owned, so that a new node of the same
    name inherits nothing: secrets, ssh host keys, credentials, overlay builds, status,
    reported facts."""
    SecretStore(config).forget("nodes", names)
    forget_credentials(config, names)
    for name in names:
        forget_host_keys(config, name)
        shutil.rmtree(node_dir(config, name), ignore_errors=True)
        clear_status(config, name)
        forget_facts(config, name)


GENERATED_SECRETS = {"ssh-host-keys": rotate_host_keys}
"""What `secret rotate` makes anew, by name: a function (config, node)."""


def rotate_secrets(config: Config, names: list[str], what: str) -> None:
    """Make the nodes' generated secret `what` anew (their runtime overlays are then to be
    rebuilt: provisiond.service.secrets.rotate_secret, which the CLI calls, does both)."""
    rotate = GENERATED_SECRETS.get(what)
    if rotate is None:
        raise InvalidInput(f"cannot rotate {what!r}: provisiond makes only "
                           f"{', '.join(GENERATED_SECRETS)} (set others with `secret set`)")
    for name in names:
        rotate(config, name)
