"""`provisiond image`: build, list, show, delete, import and gc of node images."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from provisiond import images
from provisiond.errors import InvalidInput
from provisiond.images.build import interrupt_on_term
from provisiond.images.registry_access import (Access, Credentials, auth_file_paths,
                                               home_directory, parse_creds)
from provisiond.images.shell import image_shell
from provisiond.images.squash import describe_boot
from provisiond.cli.context import printable
from provisiond.audit import cli_actor
from provisiond.service.images import delete_image


def register(subparsers) -> None:
    parser = subparsers.add_parser("image", help="build and manage node images")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    build = verbs.add_parser("build", help="build an image from its recipe (cached layers)")
    build.add_argument("name")
    build.add_argument("--json", action="store_true", help="print the manifest as JSON")
    build.add_argument("--no-cache", action="store_true",
                       help="rebuild every layer (e.g. to take newer packages from the mirror)")
    build.set_defaults(func=cmd_build)
    listing = verbs.add_parser("list", help="built images: size, layers, age")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="an image's manifest")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    delete = verbs.add_parser("delete", help="delete an image (refused while nodes use it)")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true", help="delete even if nodes use it")
    delete.set_defaults(func=cmd_delete)
    imp = verbs.add_parser(
        "import", help="make an image from a registry, an OCI layout or an archive",
        description="SOURCE is docker://REGISTRY/REPO[:TAG|@DIGEST] (an OCI distribution "
                    "registry, HTTPS; plain HTTP if it does not speak TLS, on loopback or "
                    "with --insecure), oci:DIR[:TAG] (an OCI layout folder), "
                    "or the path of an OCI layout or docker-archive tarball. The linux/amd64 "
                    "image is taken; every blob is checked against its digest; each image "
                    "layer becomes one layer. A registry that asks for a login gets --creds, "
                    "else the first entry for it in the auth files skopeo, podman and docker "
                    "read: --authfile (else $REGISTRY_AUTH_FILE, else "
                    "$XDG_RUNTIME_DIR/containers/auth.json), "
                    "$XDG_CONFIG_HOME/containers/auth.json, ~/.docker/config.json "
                    "($DOCKER_CONFIG), ~/.dockercfg. Credential helpers are not supported. "
                    "An existing image NAME is refused without --force or --update, the "
                    "name of a shipped recipe without --force (the import would shadow it).")
    imp.add_argument("source", metavar="SOURCE")
    imp.add_argument("name")
    imp.add_argument("unexpected", nargs="*", default=[], help=argparse.SUPPRESS)
    imp.add_argument("--insecure", action="store_true",
                     help="allow plain HTTP to a registry (and its token service) that is "
                          "not on loopback, if it does not speak TLS (HTTPS is tried first)")
    imp.add_argument("--creds", metavar="USER[:PASSWORD]",
                     help="log in to the registry as USER; without :PASSWORD the password "
                          "comes from --password-stdin or is asked on the terminal "
                          "(a password given here shows in `ps`)")
    imp.add_argument("--password-stdin", action="store_true",
                     help="read the password of --creds USER from standard input")
    imp.add_argument("--authfile", type=Path, metavar="PATH",
                     help="an auth file (containers-auth.json or docker config.json format) "
                          "searched first")
    _add_tls_verify(imp)
    imp.add_argument("--cert-dir", type=Path, metavar="DIR",
                     help="trust the CA certificates (*.crt) in DIR and present its client "
                          "certificate (NAME.cert with NAME.key), instead of the registry's "
                          "folder /etc/containers/certs.d/HOST[:PORT]/, else "
                          "/etc/docker/certs.d/HOST[:PORT]/, read by default")
    imp.add_argument("--ca-file", type=Path, action="append", default=[], metavar="PATH",
                     help="trust the CA certificates (PEM) in PATH (repeatable)")
    imp.add_argument("--init", default="/sbin/init", help="the image's init (default %(default)s)")
    imp.add_argument("--kernel-arg", action="append", dest="kernel_args", default=[],
                     metavar="ARG", help="a default kernel argument (repeatable)")
    over = imp.add_mutually_exclusive_group()
    over.add_argument("--force", action="store_const", dest="over",
                      const=images.OverExisting.REPLACE, default=images.OverExisting.REFUSE,
                      help="replace an existing image NAME (or its recipe folder), as "
                           "`image delete` then an import would: the layers `image shell` "
                           "added to it are dropped, and the session tarballs kept in "
                           "<state>/images/NAME/shell/ with them; or shadow the shipped "
                           "recipe NAME")
    over.add_argument("--update", action="store_const", dest="over",
                      const=images.OverExisting.UPDATE,
                      help="import into an existing image NAME: the new content replaces "
                           "what it was made of, and the layers `image shell` added to it "
                           "stay on top, as through a rebuild")
    imp.set_defaults(func=cmd_import)
    shell = verbs.add_parser(
        "shell", help="a shell in a writable copy of an image; changes become a new layer",
        description="Run a shell (or --command) as root in a chroot of the built image, "
                    "over an overlayfs of its layers. If it exits 0 (leave with `exit 0`), "
                    "what it changed becomes one new top layer (deletions as whiteouts; "
                    "package tools' logs and caches left out, as in a recipe's run layer) "
                    "and the image is rebuilt, reusing every other layer; any other exit, "
                    "Ctrl-C or a hangup keeps the image as it was (an interactive shell on "
                    "a terminal that ends with another status asks first). /proc, /sys, a "
                    "/dev of its own (with the host's terminals) and, read-only, the "
                    "host's /etc/resolv.conf are mounted in the chroot: set the image's "
                    "resolv.conf in its recipe. The layer is "
                    "kept under <state>/images/NAME/shell/ and stays on top through later "
                    "builds until the image is deleted (or replaced by `image import "
                    "--force`). If the rebuild fails, or the image was deleted and built "
                    "again or replaced meanwhile (another image), the image is "
                    "left as it is and the layer's tarball is kept there, listed nowhere: "
                    "the error names it, and `image gc` shows it.")
    shell.add_argument("name")
    shell.add_argument("--command", "-c", metavar="CMD",
                       help="run CMD (bash -c, else sh -c) instead of an interactive shell")
    shell.set_defaults(func=cmd_shell)
    gc = verbs.add_parser(
        "gc", help="delete blobs that no image references",
        description="Delete the blobs and cached layer trees no image references. The "
                    "layer tarballs `image shell` kept under <state>/images/NAME/shell/ "
                    "when its layer could not be added (listed in no image) are shown, "
                    "with their size and age, and kept: they hold an administrator's "
                    "work. Add one to a recipe as a layer ({kind: tar, path: FILE}) to "
                    "keep it, or remove them all with --shell-tarballs.")
    gc.add_argument("--shell-tarballs", action="store_true",
                    help="also remove the `image shell` layer tarballs no image lists")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=cmd_gc)


def cmd_build(args, ctx) -> int:
    with interrupt_on_term(), Progress(sys.stderr) as progress:
        manifest = images.build_image(ctx.config, args.name, progress=progress,
                                      rebuild=args.no_cache)
    _summary(ctx, manifest, args.json)
    return 0


def cmd_import(args, ctx) -> int:
    _no_stray_words(args)
    access = _registry_access(args, ctx)
    with interrupt_on_term(), Progress(sys.stderr) as progress:
        manifest = images.import_image(ctx.config, args.source, args.name, progress,
                                       kernel_args=args.kernel_args, init=args.init,
                                       access=access, over=args.over)
    _summary(ctx, manifest, False)
    return 0


# --tls-verify's values as skopeo and podman take them (Go's strconv.ParseBool)
BOOLEANS = {**dict.fromkeys(("1", "t", "T", "true", "TRUE", "True"), True),
            **dict.fromkeys(("0", "f", "F", "false", "FALSE", "False"), False)}


def _boolean(text: str) -> bool:
    if text not in BOOLEANS:
        raise argparse.ArgumentTypeError(f"expected true or false (or 1, 0, t, f, as skopeo "
                                         f"takes them), not {text!r}")
    return BOOLEANS[text]


def _add_tls_verify(parser) -> None:
    """--tls-verify (true) or --tls-verify=BOOL, never a value in the next word: skopeo
    and podman (Go's pflag) read `--tls-verify docker://...` as true and the source, and
    `--tls-verify false SOURCE` as true and a stray word; argparse would take the next
    word as the value. So the import parser turns a bare --tls-verify into
    --tls-verify=true before it parses (an instance wrapper: argparse has no option
    whose value comes only after '='); `--tls-verify false`, wherever it stands, is one
    line (a 'false' that is SOURCE or NAME is never what was meant)."""
    parser.add_argument("--tls-verify", type=_boolean, nargs="?", const=True, default=True,
                        metavar="BOOL", help="verify the registry's TLS certificate (the "
                        "default); --tls-verify=false accepts any (the value only after '=')")
    parse = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        words, after_bare = _explicit_tls_verify(sys.argv[1:] if args is None else args)
        for word in after_bare:
            if word in BOOLEANS and not Path(word).exists():
                parser.error(f"--tls-verify takes its value after '=': --tls-verify={word}")
        return parse(words, namespace)

    parser.parse_known_args = parse_known_args


def _explicit_tls_verify(words: list[str]) -> tuple[list[str], list[str]]:
    """Each bare --tls-verify (or an abbreviation, as argparse takes them) before a `--`
    made --tls-verify=true; and the words that followed one."""
    made, after_bare, options, bare = [], [], True, False
    for word in words:
        if bare:
            after_bare.append(word)
        options = options and word != "--"
        bare = options and word.startswith("--t") and "--tls-verify".startswith(word)
        made.append("--tls-verify=true" if bare else word)
    return made, after_bare


def _no_stray_words(args) -> None:
    """A third word (argparse would list it as unrecognized, with no word of why)."""
    if args.unexpected:
        raise InvalidInput(f"image import takes SOURCE NAME; unexpected: "
                           f"{' '.join(args.unexpected)}")


def _registry_access(args, ctx) -> Access:
    """The registry options as one value; the password asked for here if it must be."""
    registry_only = args.creds or args.password_stdin or args.authfile or args.cert_dir \
        or args.ca_file or not args.tls_verify
    if registry_only and not args.source.startswith("docker://"):
        raise InvalidInput("--creds, --password-stdin, --authfile, --tls-verify, --cert-dir "
                           "and --ca-file are for docker:// sources only")
    if args.authfile and not args.authfile.is_file():
        raise InvalidInput(f"--authfile {args.authfile}: no such file"
                           + (" (a directory)" if args.authfile.is_dir() else ""))
    home, no_home = home_directory()
    return Access(credentials=_credentials(args, ctx), insecure=args.insecure,
                  auth_files=auth_file_paths(args.authfile, os.environ, home),
                  no_home=no_home, tls_verify=args.tls_verify, ca_files=tuple(args.ca_file),
                  cert_dir=args.cert_dir)


def _credentials(args, ctx) -> Credentials | None:
    """--creds USER:PASSWORD, or USER with the password from stdin or the terminal."""
    if args.password_stdin and not args.creds:
        raise InvalidInput("--password-stdin needs --creds USER")
    if not args.creds:
        return None
    username, password = parse_creds(args.creds)
    if password is not None and args.password_stdin:
        raise InvalidInput("--creds USER:PASSWORD and --password-stdin: give the password once")
    if password is None and not (args.password_stdin or sys.stdin.isatty()):
        raise InvalidInput(f"no password for {username}: give --creds {username}:PASSWORD, "
                           "--password-stdin, or run on a terminal")
    if password is None:
        password = ctx.read_secret(f"password of {username}")
    return Credentials(username, password)


def cmd_shell(args, ctx) -> int:
    keep = _ask_yes if args.command is None and sys.stdin.isatty() else None
    with interrupt_on_term(), Progress(sys.stderr) as progress:
        manifest = image_shell(ctx.config, args.name, args.command, progress, keep)
    if manifest is None:
        ctx.print_line(f"{args.name}: nothing changed, no layer added")
        return 0
    _summary(ctx, manifest, False)
    return 0


def _ask_yes(question: str) -> bool:
    """A 'y' or 'yes' typed at the terminal; anything else, or Ctrl-D, is a no."""
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        print(file=sys.stderr)
        return False


def _summary(ctx, manifest: dict, as_json: bool) -> None:
    if as_json:
        ctx.print_json(manifest)
        return
    ctx.print_line(f"{manifest['name']}: {len(manifest['layers'])} layers, "
          f"{_size(manifest['total_size'])}, kernel {manifest['kernel']['version']}, "
          f"{manifest['build_seconds']:.1f}s")


def cmd_list(args, ctx) -> int:
    found = images.list_images(ctx.config)
    if args.json:
        ctx.print_json(found)
        return 0
    rows = [[m["name"], len(m["layers"]), _size(m["total_size"]), m["kernel"]["version"],
             _age(m["built_at"]), f"{m['build_seconds']:.1f}s"] for m in found]
    ctx.print_table(["NAME", "LAYERS", "SIZE", "KERNEL", "AGE", "BUILD"], rows)
    return 0


def cmd_show(args, ctx) -> int:
    manifest = images.load_manifest(ctx.config, args.name)
    if args.json:
        ctx.print_json(manifest)
        return 0
    ctx.print_line(f"name:        {manifest['name']}")
    ctx.print_line(f"kernel:      {manifest['kernel']['version']} {manifest['kernel']['digest']} "
          f"({_size(manifest['kernel']['size'])})")
    ctx.print_line(f"init:        {manifest['init']}")
    ctx.print_line(f"kernel args: {' '.join(manifest['kernel_args']) or '-'}")
    ctx.print_line(f"recipe:      {manifest['recipe']['path']}")
    ctx.print_line(f"built:       {manifest['built_at']} in {manifest['build_seconds']:.1f}s, "
          f"total {_size(manifest['total_size'])}")
    ctx.print_line(f"boot:        {describe_boot(manifest)}")
    rows = [[i, l["kind"], _size(l["size"]), l["digest"][:19], l["description"]]
            for i, l in enumerate(manifest["layers"], 1)]
    ctx.print_table(["#", "KIND", "SIZE", "DIGEST", "DESCRIPTION"], rows)
    return 0


def cmd_delete(args, ctx) -> int:
    delete_image(ctx.config, cli_actor(), args.name, force=args.force)
    print(f"deleted image {args.name}; run `provisiond image gc` to free its blobs")
    return 0


def cmd_gc(args, ctx) -> int:
    result = images.collect_garbage(ctx.config, shell_tarballs=args.shell_tarballs)
    if args.json:
        ctx.print_json(result)
        return 0
    print(f"removed {result['blobs_removed']} blob(s), freed "
          f"{_size(result['bytes_freed'])}, {result['trees_removed']} cached layer tree(s)")
    _print_shell_tarballs(result, ctx)
    return 0


def _print_shell_tarballs(result: dict, ctx) -> None:
    """gc's lines on the `image shell` tarballs no image lists (none when there are none)."""
    removed, kept = result["shell_tarballs_removed"], result["shell_tarballs_kept"]
    partials = result["shell_partials_removed"]
    if removed:
        ctx.print_line(f"removed {len(removed)} `image shell` layer tarball(s) no image "
                       f"listed, {_size(sum(t['size'] for t in removed))}")
    if partials:
        ctx.print_line(f"removed {len(partials)} half-written `image shell` layer "
                       f"tarball(s) of killed sessions, "
                       f"{_size(sum(t['size'] for t in partials))}")
    for unreadable in result["shell_listings_unreadable"]:
        ctx.print_line(f"{unreadable['error']}: its `image shell` tarballs are left as "
                       "they are")
    if kept:
        ctx.print_line(f"kept {len(kept)} `image shell` layer tarball(s) no image lists "
                       f"(a session's layer that could not be added), "
                       f"{_size(sum(t['size'] for t in kept))}:")
        for tar in kept:
            ctx.print_line(f"  {tar['path']}  {_size(tar['size'])}, "
                           f"{_age(tar['modified'])}")
        print("  to keep one, add it to a recipe as a layer ({kind: tar, path: FILE}); "
              "`provisiond image gc --shell-tarballs` removes them")


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _age(stamp: str) -> str:
    built = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    seconds = (datetime.datetime.now(datetime.timezone.utc) - built).total_seconds()
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds // span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


RUNNING = ("building", "fetching")  # a line that the next event for the step replaces


class Progress:
    """Per-layer progress: a redrawn bar on a terminal, one plain line per event otherwise."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.tty:
            self.stream.write("\n")

    def __call__(self, event: dict) -> None:
        running = event["status"] in RUNNING
        done = event["index"] - running
        head = printable(f"[{event['index']}/{event['count']}] {event['kind']}: "
                         f"{event['description']}")  # the recipe's text
        tail = event["status"]
        if "size" in event:
            tail += f" {_size(event['size'])}"
        if "seconds" in event:
            tail += f" in {event['seconds']:.1f}s"
        if not self.tty:
            print(f"{head} ... {tail}", file=self.stream, flush=True)
            return
        width = 20
        filled = width * done // event["count"]
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r\x1b[K[{bar}] {head[:60]} {tail}")
        if not running:
            self.stream.write("\n")
        self.stream.flush()
