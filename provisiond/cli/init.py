"""`provisiond init`: a working state directory with a commented provisiond.yaml (and a
.gitignore of what a state dir kept in git must not hold)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from provisiond.audit import cli_actor
from provisiond.cli import unit
from provisiond.cli.ownership import hand_back
from provisiond.config import (SHIPPED_DIR, StoreAuthSettings, StoreTlsSettings, load_config,
                               parse_store_url, unicast_address, write_default_config)
from provisiond.errors import InvalidInput
from provisiond.gitignore import GITIGNORE_NAME, write_gitignore
from provisiond.inventory import InventoryStore
from provisiond.inventory.model import Record
from provisiond.service import records
from provisiond.service.inventory import PROFILES
from provisiond.state.layout import Layout

SHIPPED_PROFILES = SHIPPED_DIR / "profiles"
STORE_FLAGS = [
    ("--store-ca", "FILE", "store_tls.ca_file: the CA (PEM) the etcd members' certificates "
     "are checked against (default: the system's)"),
    ("--store-cert", "FILE", "store_tls.cert_file: the client certificate (PEM) for members "
     "run with --client-cert-auth; with --store-key"),
    ("--store-key", "FILE", "store_tls.key_file: its unencrypted key (PEM)"),
    ("--store-user", "NAME", "store_auth.user: the etcd user (etcd authentication enabled); "
     "with --store-password-file"),
    ("--store-password-file", "FILE", "store_auth.password_file: the file holding its "
     "password, mode 0600 (never on the command line)"),
]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "init", help="create the state directory, provisiond.yaml and the shipped profiles")
    parser.add_argument("--address", help="server.address to write into a new provisiond.yaml "
                        "(an existing one is kept: it must have that address already)")
    parser.add_argument("--store", metavar="etcd[s]://HOST:PORT[,...]",
                        help="store: to write into a new provisiond.yaml: the etcd cluster "
                        "this server shares with the others (every member; etcds:// over "
                        "TLS; default: the state directory's files)")
    for flag, metavar, text in STORE_FLAGS:
        parser.add_argument(flag, metavar=metavar, help=text)
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
    store = check_store_flags(args, ctx.state_dir if existed else None)
    address = check_address(args.address, ctx.state_dir if existed else None)
    path = write_default_config(ctx.state_dir)
    if not existed:
        text = path.read_text()
        if address:
            text = text.replace("  address: 127.0.0.1", f"  address: {address}", 1)
        if store:
            text = text.replace("\nstore: null\n", f"\n{yaml.safe_dump(store, sort_keys=False)}",
                                1)
        path.write_text(text)
    config = load_config(ctx.state_dir)
    for folder in (layout.blobs, layout.images, layout.overlays, layout.status_dir):
        Path(folder).mkdir(parents=True, exist_ok=True)
    imported = [] if args.no_profiles else import_profiles(config, SHIPPED_PROFILES)
    print(f"{'kept' if existed else 'wrote'} {path}")
    try:
        ignore = write_gitignore(layout)
        print(f"wrote {ignore}" if ignore else f"kept {layout.root / GITIGNORE_NAME}")
    except OSError as exc:  # only an aid for sites keeping the state dir in git
        ctx.print_line(f"warning: {layout.root / GITIGNORE_NAME} not written: "
                       f"{exc.strerror or exc}", file=sys.stderr)
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


def check_address(address: str | None, existing: Path | None) -> str | None:
    """--address checked as provisiond.yaml's server.address is, before anything is
    written; with an existing provisiond.yaml (kept as it is), it must be the one it has."""
    if not address:
        return None
    try:
        address = unicast_address(address)
    except ValueError as exc:
        raise InvalidInput(f"--address: {exc}") from None
    if existing is not None:
        has = load_config(existing).server.address
        if address != has:
            raise InvalidInput(f"--address: {Layout(existing).settings} has server.address: "
                               f"{has}; edit it there")
    return address


def check_store_flags(args, existing: Path | None) -> dict:
    """The store settings the --store flags name (store, store_tls, store_auth), their files
    checked; with an existing provisiond.yaml, they must be the ones it has (init never
    moves a site: `provisiond state export|import` does)."""
    if args.store is None:
        if any(getattr(args, _dest(flag)) for flag, _, _ in STORE_FLAGS):
            raise InvalidInput("--store-*: for an etcd store: add --store etcd[s]://...")
        return {}
    try:
        uses_tls = parse_store_url(args.store).tls
    except ValueError as exc:
        raise InvalidInput(f"--store: {exc}") from None
    settings = {"store": args.store, **store_access(args, uses_tls)}
    if existing is not None:
        stored = load_config(existing)
        for name, value in settings.items():
            has = _dumped(getattr(stored, name))
            if not _within(value, has):
                raise InvalidInput(
                    f"--store: {Layout(existing).settings} has {name}: {has or 'null'}; edit "
                    "it there (and move the documents with `provisiond state export` then "
                    "`state import`)")
    return settings


def store_access(args, uses_tls: bool) -> dict:
    """store_tls and store_auth from the flags, files made absolute and checked."""
    from provisiond.state.etcd import read_password, tls_files

    settings = {}
    tls = {key: str(Path(value).absolute()) for key, value in (
        ("ca_file", args.store_ca), ("cert_file", args.store_cert),
        ("key_file", args.store_key)) if value}
    if tls and not uses_tls:
        raise InvalidInput("--store-ca, --store-cert, --store-key: for an etcds:// store")
    if bool(args.store_cert) != bool(args.store_key):
        raise InvalidInput("--store-cert and --store-key go together")
    if tls:
        tls_files(StoreTlsSettings(**tls))
        settings["store_tls"] = tls
    if bool(args.store_user) != bool(args.store_password_file):
        raise InvalidInput("--store-user and --store-password-file go together")
    if args.store_user:
        auth = {"user": args.store_user,
                "password_file": str(Path(args.store_password_file).absolute())}
        try:
            checked = StoreAuthSettings(**auth)
        except ValueError:  # pydantic's, of the user name
            raise InvalidInput(f"--store-user: {args.store_user!r}: 1-256 characters, no "
                               "control characters") from None
        read_password(checked)
        settings["store_auth"] = auth
    return settings


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _within(given, stored) -> bool:
    """Whether a setting from the flags is the stored one (a section: the keys given)."""
    if isinstance(given, dict):
        return isinstance(stored, dict) and all(stored.get(k) == v for k, v in given.items())
    return given == stored


def _dumped(value):
    """A setting as init writes it: a section as a dict of strings, None as None."""
    if value is None or isinstance(value, str):
        return value
    return {key: str(item) for key, item in value.model_dump(exclude_none=True).items()}


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
