"""`provisiond init`: a working state directory with a commented provisiond.yaml."""

from __future__ import annotations

from pathlib import Path

import yaml

from provisiond.audit import cli_actor
from provisiond.cli import unit
from provisiond.cli.ownership import hand_back
from provisiond.config import (SHIPPED_DIR, load_config, parse_store_url,
                               write_default_config)
from provisiond.errors import InvalidInput
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.service import records
from provisiond.service.inventory import PROFILES
from provisiond.state.layout import Layout

SHIPPED_PROFILES = SHIPPED_DIR / "profiles"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "init", help="create the state directory, provisiond.yaml and the shipped profiles")
    parser.add_argument("--address", help="server.address to write into a new provisiond.yaml")
    parser.add_argument("--store", metavar="etcd://HOST:PORT[,...]",
                        help="store: to write into a new provisiond.yaml: the etcd cluster "
                        "this server shares with the others (every member; default: the "
                        "state directory's files)")
    parser.add_argument("--no-profiles", action="store_true",
                        help="do not import the shipped example profiles")
    parser.add_argument("--systemd", action="store_true",
                        help="as root: also write the systemd unit that runs `provisiond serve` "
                        "as --user, and give the state directory to that user")
    parser.add_argument("--user", default="provisiond",
                        help="the service's user for --systemd; must exist (default: provisiond)")
    parser.add_argument("--unit-dir", default=str(unit.UNIT_DIR), type=Path,
                        help=f"where --systemd writes {unit.UNIT_NAME} (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args, ctx) -> None:
    # Before anything is written: root, a user to give the directory to, a unit to write.
    unit_text = unit.unit_text(ctx.state_dir, args.user) if args.systemd else None
    layout = Layout(ctx.state_dir)
    existed = layout.settings.exists()
    check_store_flag(args.store, ctx.state_dir if existed else None)
    path = write_default_config(ctx.state_dir)
    if not existed:
        text = path.read_text()
        if args.address:
            text = text.replace("  address: 127.0.0.1", f"  address: {args.address}", 1)
        if args.store:
            text = text.replace("\nstore: null\n", f"\nstore: {args.store}\n", 1)
        path.write_text(text)
    config = load_config(ctx.state_dir)
    for folder in (layout.blobs, layout.images, layout.overlays, layout.status_dir):
        Path(folder).mkdir(parents=True, exist_ok=True)
    imported = [] if args.no_profiles else import_profiles(config, SHIPPED_PROFILES)
    print(f"{'kept' if existed else 'wrote'} {path}")
    if imported:
        print(f"imported profiles: {', '.join(imported)}")
    if unit_text:
        uid, gid, _ = unit.service_user(args.user)
        hand_back(ctx.state_dir, uid, gid)
        written = unit.write_unit(unit_text, args.unit_dir)
        print(f"wrote {written}: `provisiond serve` as {args.user}, who now owns "
              f"{ctx.state_dir}\n"
              "next: systemctl daemon-reload && systemctl enable --now provisiond; then, as "
              "root, `provisiond image build NAME` for the nodes' images")


def check_store_flag(url: str | None, existing: Path | None) -> None:
    """--store must be an etcd URL, and the one an existing provisiond.yaml names (init
    never moves a site: `provisiond state export|import` does)."""
    if url is None:
        return
    try:
        parse_store_url(url)
    except ValueError as exc:
        raise InvalidInput(f"--store: {exc}") from None
    if existing is not None:
        stored = load_config(existing).store
        if stored != url:
            raise InvalidInput(f"--store: {Layout(existing).settings} has store: {stored or 'null'}"
                               "; edit it there (and move the documents with `provisiond "
                               "state export` then `state import`)")


def import_profiles(config, folder: Path) -> list[str]:
    """Add each `<folder>/<name>.yaml` as a profile unless one of that name exists, through
    the service layer (audited as profile.create, announced as inventory.changed)."""
    stored = InventoryStore(config).read().profiles
    found: dict[str, Record] = {}
    for path in sorted(folder.glob("*.yaml")):
        if path.stem in stored:
            continue
        try:
            data = yaml.safe_load(path.read_text()) or {}
            found[path.stem] = Record.model_validate(data)
        except (yaml.YAMLError, ValueError) as exc:
            raise InvalidInput(f"{path}: {' '.join(str(exc).split())}") from None
    if found:
        records.write_records(config, cli_actor(), PROFILES, "create", list(found),
                              lambda name, _: found[name], create=True)
    return list(found)
