"""How provisiond reaches and logs in to a registry: credentials (given, or found in the auth
files skopeo, podman and docker read), the registry's WWW-Authenticate challenge, and the
TLS trust (a private CA, or no verification).

Auth files, read in this order until one has an entry for the registry (the order of
containers-auth.json(5)): `--authfile PATH` or else $REGISTRY_AUTH_FILE or else
$XDG_RUNTIME_DIR/containers/auth.json; then $XDG_CONFIG_HOME/containers/auth.json
(~/.config/...), $DOCKER_CONFIG/config.json (~/.docker/config.json), ~/.dockercfg. Within a
file the most specific key wins: host/ns/repo, then host/ns, then host.

TLS trust as containers-certs.d(5) and docker lay it out: `--cert-dir DIR`, else the first of
/etc/containers/certs.d/HOST[:PORT]/ and /etc/docker/certs.d/HOST[:PORT]/ that exists; its
`*.crt` are CAs added to the system's, a `NAME.cert` with its `NAME.key` a client
certificate."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from provisiond.errors import InvalidInput

# Docker Hub's names: what `docker login` writes (a legacy URL), what podman writes, and the
# host the distribution API is served from.
DOCKER_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io")
# One piece of a WWW-Authenticate header: a parameter (key=value, the value quoted or bare),
# else a bare word, which starts the next challenge (its scheme; a token68 such as
# Negotiate's, read so, only starts a challenge nobody answers).
PIECE_RE = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]*))|([^\s,=]+)')
MAX_AUTH_FILE = 1 << 20  # docker's config.json for hundreds of registries is a few KiB
ANSWERED = ("bearer", "basic")  # the schemes a login is given for, preferred first
# Where podman and skopeo (containers/image), then docker, look for a registry's folder
# HOST[:PORT]; the first that exists is used, the others not read (as containers/image does).
CERTS_D = (Path("/etc/containers/certs.d"), Path("/etc/docker/certs.d"))


@dataclass(frozen=True)
class Credentials:
    """A user name and password for one registry; the password never printed."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self):
        # argv, and stdin in the C locale, keep bytes that are not UTF-8 as surrogates,
        # which no header can carry (basic() failed with UnicodeEncodeError)
        for what, text in (("user name", self.username), ("password", self.password)):
            try:
                text.encode()
            except UnicodeEncodeError:
                raise InvalidInput(f"the {what} of the registry login for "
                                   f"{self.username.encode(errors='replace').decode()} is "
                                   "not valid UTF-8") from None

    def basic(self) -> str:
        """The Authorization header's value for HTTP Basic."""
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()


@dataclass(frozen=True)
class Access:
    """The `image import` options for a registry: who logs in and which TLS is trusted.

    `credentials` (from --creds) go first; else `auth_files` are searched. `insecure`
    allows plain HTTP off loopback; `tls_verify` False accepts any certificate; `ca_files`
    are trusted besides the system's CAs, and the registry's certs.d folder (`cert_dir`,
    else its folder under one of `certs_d`) gives more CAs and a client certificate.
    `no_home` says why the auth files of the home directory were not searched."""

    credentials: Credentials | None = None
    auth_files: tuple[Path, ...] = ()
    insecure: bool = False
    tls_verify: bool = True
    ca_files: tuple[Path, ...] = ()
    cert_dir: Path | None = None
    certs_d: tuple[Path, ...] = field(default_factory=lambda: CERTS_D)
    no_home: str | None = None


@dataclass(frozen=True)
class Challenge:
    """A WWW-Authenticate challenge: its scheme (lower case) and parameters."""

    scheme: str
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge:
    """The challenge to answer of a WWW-Authenticate header (several challenges may share
    it, or its lines joined with ", "): Bearer, else Basic, else the first; quoted values may
    hold commas and backslash escapes; an empty header gives scheme ''."""
    challenges = parse_challenges(header)
    for scheme in ANSWERED:
        found = next((c for c in challenges if c.scheme == scheme), None)
        if found:
            return found
    return challenges[0] if challenges else Challenge("", {})


def parse_challenges(header: str) -> list[Challenge]:
    """`Bearer realm="...",service="...",scope="repository:a/b:pull"`, `Basic realm="x"`,
    or several: `Negotiate, Basic realm="x"`."""
    challenges: list[Challenge] = []
    for key, quoted, bare, word in PIECE_RE.findall(header):
        if word:
            challenges.append(Challenge(word.lower(), {}))
        elif challenges:  # a parameter before any scheme belongs to none
            challenges[-1].params[key.lower()] = re.sub(r"\\(.)", r"\1", quoted) \
                if quoted or not bare else bare
    return challenges


def parse_creds(text: str) -> tuple[str, str | None]:
    """`USER[:PASSWORD]` as --creds takes it; the password may hold colons."""
    username, colon, password = text.partition(":")
    if not username:
        raise InvalidInput("--creds needs a user name: --creds USER[:PASSWORD]")
    return username, password if colon else None


def auth_file_paths(authfile: Path | None, environ: Mapping[str, str],
                    home: Path | None) -> tuple[Path, ...]:
    """The auth files to search, in order (see the module's docstring); without a home
    directory, only those an option or a variable names."""
    primary = authfile or _env_path(environ, "REGISTRY_AUTH_FILE")
    if primary is None and environ.get("XDG_RUNTIME_DIR"):
        primary = Path(environ["XDG_RUNTIME_DIR"]) / "containers/auth.json"
    config_home = _env_path(environ, "XDG_CONFIG_HOME") or home and home / ".config"
    docker = _env_path(environ, "DOCKER_CONFIG") or home and home / ".docker"
    found = (primary, config_home and config_home / "containers/auth.json",
             docker and docker / "config.json", home and home / ".dockercfg")
    return tuple(path for path in found if path)


def home_directory() -> tuple[Path | None, str | None]:
    """(the user's home, None), or (None, why there is none): no $HOME and no passwd entry
    (a service started with an empty environment under an unlisted user ID)."""
    try:
        return Path.home(), None
    except (RuntimeError, KeyError):
        return None, (f"no home directory ($HOME is unset and user ID {os.getuid()} has no "
                      "passwd entry), so ~/.docker/config.json and ~/.config were not read")


def _env_path(environ: Mapping[str, str], name: str) -> Path | None:
    return Path(environ[name]) if environ.get(name) else None


def find_credentials(files: tuple[Path, ...], registry: str,
                     repository: str) -> Credentials | None:
    """The first credentials for `registry/repository` in `files` (a missing file is
    skipped); None if none has any."""
    keys = _lookup_keys(registry, repository)
    for path in files:
        document = _read_auth_file(path)
        if document is not None:
            found = _credentials_in(document, keys, path)
            if found is not None:
                return found
    return None


def _lookup_keys(registry: str, repository: str) -> list[str]:
    """host/ns/repo, host/ns, host: most specific first (Docker Hub as `docker.io`)."""
    host = "docker.io" if registry in DOCKER_HUB_KEYS else registry
    parts = repository.split("/")
    return [f"{host}/{'/'.join(parts[:n])}" for n in range(len(parts), 0, -1)] + [host]


def _read_auth_file(path: Path) -> dict | None:
    """The file's entries as {normalized key: entry} plus the helper settings; None when
    the file does not exist."""
    try:
        document = json.loads(_auth_file_bytes(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"auth file {path}: cannot read it as JSON: "
                           f"{_why(exc)}") from None
    except RecursionError:
        raise InvalidInput(f"auth file {path}: its JSON nests too deep") from None
    if not isinstance(document, dict):
        raise InvalidInput(f"auth file {path}: not a JSON object")
    # ~/.dockercfg (docker before 1.7) holds the entries without the "auths" wrapper
    legacy = path.name == ".dockercfg" and "auths" not in document
    auths = document if legacy else document.get("auths", {})
    if not isinstance(auths, dict):
        raise InvalidInput(f"auth file {path}: \"auths\" is not an object")
    entries = {_normalize_key(key): entry for key, entry in auths.items()}
    return {"entries": entries, "credsStore": document.get("credsStore"),
            "credHelpers": document.get("credHelpers") or {}}


def _auth_file_bytes(path: Path) -> bytes:
    """A regular file's bytes, at most MAX_AUTH_FILE ($REGISTRY_AUTH_FILE=/dev/zero or a
    FIFO must not hang or fill memory)."""
    # O_NONBLOCK: opening a FIFO waits for a writer otherwise (no effect on a file)
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = file.read(MAX_AUTH_FILE + 1)
    if len(data) > MAX_AUTH_FILE:
        raise ValueError(f"larger than {MAX_AUTH_FILE >> 20} MiB")
    return data


def _normalize_key(key: str) -> str:
    """`https://index.docker.io/v1/` (docker login's legacy URL form) -> `docker.io`; a
    plain `host[/namespace]` key is kept."""
    if key.startswith(("http://", "https://")):
        key = key.split("://", 1)[1].split("/", 1)[0]
    host, slash, rest = key.partition("/")
    return ("docker.io" if host in DOCKER_HUB_KEYS else host) + slash + rest


def _credentials_in(document: dict, keys: list[str], path: Path) -> Credentials | None:
    helpers = document["credHelpers"]
    helper = next((helpers[k] for k in keys if isinstance(helpers, dict) and k in helpers), None)
    entry = next((document["entries"][k] for k in keys if k in document["entries"]), None)
    if helper:
        raise _helper_unsupported(path, f"credHelpers names {helper!r} for {keys[-1]}")
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise InvalidInput(f"auth file {path}: the entry for {keys[-1]} is not an object")
    if entry.get("identitytoken"):
        raise _helper_unsupported(path, f"the entry for {keys[-1]} holds an identity token")
    if not entry.get("auth"):
        if document["credsStore"]:
            raise _helper_unsupported(path, f"credsStore {document['credsStore']!r} "
                                            f"holds the login for {keys[-1]}")
        return None
    return _decode_auth(entry["auth"], path, keys[-1])


def _helper_unsupported(path: Path, what: str) -> InvalidInput:
    return InvalidInput(f"auth file {path}: {what}; credential helpers are not supported "
                        "(use --creds USER, or an auth file with an \"auth\" entry)")


def _decode_auth(value, path: Path, host: str) -> Credentials:
    """base64(user:password), as `podman login` and `docker login` write it."""
    try:
        username, colon, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (TypeError, ValueError, binascii.Error, UnicodeDecodeError):
        colon = ""
    if not colon or not username:
        raise InvalidInput(f"auth file {path}: the \"auth\" of {host} is not "
                           "base64 of USER:PASSWORD")
    return Credentials(username, password)


def tls_context(access: Access, registry: str) -> ssl.SSLContext:
    """The system's CAs plus `access.ca_files` and the registry's certs.d CAs, or no
    verification at all; the certs.d client certificate, if any, either way."""
    folder = registry_cert_dir(access, registry)
    cas, client = cert_dir_files(folder)
    if access.cert_dir and not (cas or client):
        raise InvalidInput(f"--cert-dir {folder}: no CA certificate (*.crt) nor client "
                           "certificate (*.cert, *.key) in it")
    context = ssl.create_default_context()
    if client:
        _load_client_certificate(context, *client)
    if not access.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    for path in (*access.ca_files, *cas):
        try:
            context.load_verify_locations(cafile=str(path))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(f"CA file {path}: cannot load it as PEM certificates: "
                               f"{_why(exc)}") from None
    return context


def _load_client_certificate(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    try:  # a key with a passphrase is refused, not asked for on the terminal by OpenSSL
        context.load_cert_chain(str(cert), str(key), password=lambda: b"")
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInput(f"client certificate {cert} and key {key.name}: cannot load them "
                           f"as PEM (a key with a passphrase is not supported): "
                           f"{_why(exc)}") from None


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def registry_cert_dir(access: Access, registry: str) -> Path | None:
    """`access.cert_dir` (it must exist), else the registry's HOST[:PORT] folder under the
    first of `access.certs_d` that has one, else None."""
    if access.cert_dir is not None:
        if not access.cert_dir.is_dir():
            raise InvalidInput(f"--cert-dir {access.cert_dir}: no such directory")
        return access.cert_dir
    name = "docker.io" if registry in DOCKER_HUB_KEYS else registry
    if name in (".", ".."):  # a host name that is a path step
        return None
    return next((base / name for base in access.certs_d if (base / name).is_dir()), None)


def cert_dir_files(folder: Path | None) -> tuple[tuple[Path, ...], tuple[Path, Path] | None]:
    """The CA certificates (`*.crt`) of a containers-certs.d(5) folder, and its client
    certificate: the first `NAME.cert` (by name) with its `NAME.key`. A `.cert` or `.key`
    without its other half is one line."""
    if folder is None:
        return (), None
    try:
        files = sorted(path for path in folder.iterdir() if path.is_file())
    except OSError as exc:
        raise InvalidInput(f"certificate folder {folder}: cannot read it: {_why(exc)}") from None
    names = {path.name for path in files}
    for path in files:
        other = {".cert": ".key", ".key": ".cert"}.get(path.suffix)
        if other and path.stem + other not in names:
            half = "client certificate" if other == ".key" else "client key"
            raise InvalidInput(f"{path}: a {half} without its {path.stem}{other} "
                               "(CA certificates end in .crt)")
    certs = [path for path in files if path.suffix == ".cert"]
    return (tuple(path for path in files if path.suffix == ".crt"),
            (certs[0], certs[0].with_suffix(".key")) if certs else None)
