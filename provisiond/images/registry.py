"""Pulling one image from an OCI distribution registry (`docker://REGISTRY/REPO:TAG`).

The distribution API (GET /v2/<repo>/manifests/<ref>, /v2/<repo>/blobs/<digest>) over
HTTPS, or plain HTTP for a registry on loopback or with `insecure` that does not speak TLS
(HTTPS is tried first: a registry that speaks it never gets the login in the clear). A
registry that answers 401 with `Basic realm=...` gets the credentials; with a
`Bearer realm=...,service=...,scope=...` challenge, a token from its realm, fetched with the
credentials if there are any, else anonymously, as docker and skopeo do
(provisiond.images.registry_access finds the credentials and builds the TLS context)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import ipaddress
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import BinaryIO

from provisiond.errors import InvalidInput
from provisiond.images.layout import (INDEXES, MANIFESTS, MAX_MANIFEST, ImageRefNotFound,
                                      ImportFailed, LayoutWriter, check_digest,
                                      check_manifest, media_type,
                                      pick_platform, verify_document)
from provisiond.images.registry_access import (Access, Challenge, Credentials,
                                               find_credentials, parse_challenge,
                                               tls_context)

# The distribution spec's grammar for repository names, tags and digests.
REPO_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)"
                     r"[a-z0-9]+)*)*")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")
TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # RFC 6750's b64token, loosely: no space, no CR/LF
# USER[:PASSWORD]@ before the host: an "@" that does not start a sha256 digest
LOGIN_RE = re.compile(r"docker://[^@]*@(?!sha256:)")
HOST_RE = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(?::\d{1,5})?")
DOCKER_HUB = "registry-1.docker.io"
ACCEPT = ", ".join([*INDEXES, *MANIFESTS])
TIMEOUT = 60


@dataclass(frozen=True)
class Reference:
    """A parsed `docker://` reference; `ref` is the tag or the digest."""

    registry: str
    repository: str
    ref: str

    def __str__(self) -> str:
        sep = "@" if self.ref.startswith("sha256:") else ":"
        return f"docker://{self.registry}/{self.repository}{sep}{self.ref}"

    @property
    def loopback(self) -> bool:
        return _loopback_host(urllib.parse.urlsplit(f"//{self.registry}").hostname)


def parse_reference(text: str) -> Reference:
    """`docker://[REGISTRY/]REPO[:TAG|@DIGEST]`; without a registry host, Docker Hub."""
    bad = f"not a registry reference: {text!r} (docker://REGISTRY/REPO:TAG)"
    if not text.startswith("docker://"):
        raise InvalidInput(bad)
    if LOGIN_RE.match(text):  # refused without echoing the text: it may hold a password
        raise InvalidInput("a docker:// reference has '@' only before a sha256 digest; a "
                           "login (USER:PASSWORD@) is not read from it: give --creds USER or "
                           "an auth file (--authfile)")
    rest = text[len("docker://"):]
    first, _, tail = rest.partition("/")
    if tail and ("." in first or ":" in first or first == "localhost" or first[:1] == "["):
        registry, rest = first, tail
    else:
        registry = DOCKER_HUB
        rest = rest if "/" in rest else f"library/{rest}"
    if "@" in rest:
        repository, ref = rest.split("@", 1)
        ok = DIGEST_RE.fullmatch(ref)
    else:
        repository, _, ref = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
        ok = TAG_RE.fullmatch(ref)
    if not (ok and REPO_RE.fullmatch(repository) and HOST_RE.fullmatch(registry)
            and _port_in_range(registry)):
        raise InvalidInput(bad)
    return Reference(registry, repository, ref)


def _port_in_range(registry: str) -> bool:
    try:
        return urllib.parse.urlsplit(f"//{registry}").port != 0
    except ValueError:  # past 65535
        return False


class Client:
    """GETs against one registry, logging in when it asks: Basic with the credentials, or a
    bearer token from its realm (anonymous, or fetched with the credentials as docker does).
    A registry on loopback, or any with `insecure`, is tried over HTTPS first and over plain
    HTTP if it does not speak TLS."""

    def __init__(self, reference: Reference, access: Access | None = None):
        self.reference, self.access = reference, access or Access()
        self.insecure = self.access.insecure
        self.scheme = "https"
        self.may_fall_back = reference.loopback or self.insecure
        self.authorization: str | None = None
        self.proven = False  # the registry took self.authorization at least once
        self.opener = urllib.request.build_opener(
            _NoDowngrade(self.insecure), urllib.request.HTTPSHandler(
                context=tls_context(self.access, reference.registry)))

    @functools.cached_property
    def credentials(self) -> Credentials | None:
        """--creds, else the auth files' entry, read only when the registry asks for a
        login (a pull that needs none never reads them)."""
        return self.access.credentials or find_credentials(
            self.access.auth_files, self.reference.registry, self.reference.repository)

    def url(self, kind: str, ref: str) -> str:
        return (f"{self.scheme}://{self.reference.registry}/v2/"
                f"{self.reference.repository}/{kind}/{ref}")

    def get(self, kind: str, ref: str, accept: str | None = None):
        """The open response of a GET of /v2/REPO/KIND/REF; a 401 logs in once. Errors are
        one line."""
        while True:
            url = self.url(kind, ref)
            request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
            if self.authorization:  # not carried over a redirect to blob storage elsewhere
                request.add_unredirected_header("Authorization", self.authorization)
            try:
                response = self.opener.open(request, timeout=TIMEOUT)
                self.proven = self.authorization is not None
                self.may_fall_back = False  # it spoke this scheme
                return response
            except urllib.error.HTTPError as exc:
                self.may_fall_back = False  # an answer: it speaks this scheme (TLS)
                challenge = ", ".join(exc.headers.get_all("WWW-Authenticate") or [])
                exc.close()
                # log in when asked; again only if the last login had served (a bearer
                # token that expired during a long pull), so a refused one is not retried;
                # only the registry's own challenge: a host it redirected to (blob storage)
                # must not pick the realm the login is sent to
                elsewhere = self._elsewhere(exc.geturl())
                if exc.code == 401 and not elsewhere and (
                        self.authorization is None or self.proven):
                    self.authorization = self._login(parse_challenge(challenge))
                    self.proven = False
                    continue
                if elsewhere:
                    raise ImportFailed(f"{self.reference}: {elsewhere}, where "
                                       f"{self.reference.registry} redirected, answered HTTP "
                                       f"{exc.code}") from None
                raise self._error(exc.code, url) from None
            except (urllib.error.URLError, OSError, http.client.HTTPException,
                    ValueError) as exc:  # ValueError: a redirect to "http://[::1/x"
                if self._fall_back_to_http(exc):
                    continue
                raise self._unreachable(exc) from None

    def _fall_back_to_http(self, exc: BaseException) -> bool:
        """A registry (on loopback, or any with insecure) that answered the TLS handshake
        with something else (plain HTTP's 400), or refused HTTPS's port 443 when its
        reference names no port (plain HTTP's is 80), is asked again over plain HTTP, once,
        and only before it has answered over HTTPS: a later handshake that breaks (a dropped
        connection is an SSLError too) must not send the login in the clear; nor is a
        certificate that does not verify."""
        reason = getattr(exc, "reason", exc)
        no_port = urllib.parse.urlsplit(f"//{self.reference.registry}").port is None
        not_tls = isinstance(reason, ssl.SSLError) and not isinstance(
            reason, ssl.SSLCertVerificationError)
        if not (self.may_fall_back and (
                not_tls or (no_port and isinstance(reason, ConnectionRefusedError)))):
            return False
        self.scheme, self.may_fall_back = "http", False
        return True

    def _elsewhere(self, url: str) -> str | None:
        """The host:port of `url` (an answer's, after redirects) if it is not the
        registry's; its URL is not shown: blob storage signs its URLs."""
        netloc = _netloc(urllib.parse.urlsplit(url))
        return netloc if netloc.lower() != self.reference.registry.lower() else None

    def _unreachable(self, exc: BaseException) -> ImportFailed:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            return ImportFailed(f"{self.reference}: the TLS certificate of "
                                f"{self.reference.registry} is not trusted "
                                f"({reason.verify_message}); give its CA with --ca-file or "
                                "--cert-dir, or --tls-verify=false")
        return ImportFailed(f"{self.reference}: cannot reach {self.reference.registry}: "
                            f"{_reason(exc)}")

    @contextlib.contextmanager
    def reading(self, what: str):
        """An answer's body that breaks off (a closed connection, a timeout, a cut chunk)
        is one line, not http.client's exception."""
        try:
            yield
        except (OSError, http.client.HTTPException) as exc:
            raise ImportFailed(f"{self.reference}: reading {what} broke off: "
                               f"{_reason(exc)}") from None

    def _error(self, code: int, url: str):
        if code == 404:
            what = "manifest" if "/manifests/" in url else "blob"
            return ImageRefNotFound(f"{self.reference}: the registry has no such {what} "
                                    f"(HTTP 404 for {url})")
        if code in (401, 403):
            return self._refused(code)
        return ImportFailed(f"{self.reference}: the registry answered HTTP {code} for {url}")

    def _refused(self, code: int, by: str = "") -> ImportFailed:
        """A 401 or 403 after logging in (or after an anonymous token): who was refused."""
        host, user = self.reference.registry, self.credentials and self.credentials.username
        by = f" (its token service {by})" if by else ""
        if user and code == 401:
            what = f"refused the login for user {user}"
        elif user:
            what = f"refused user {user} access to {self.reference.repository}"
        else:
            what = (f"refused anonymous access to {self.reference.repository}; log in with "
                    f"--creds USER or an auth file (--authfile){self._no_home()}")
        return ImportFailed(f"{self.reference}: {host}{by} {what} (HTTP {code})")

    def _login(self, challenge: Challenge) -> str:
        """The Authorization header for what the registry's 401 challenge asks."""
        if challenge.scheme == "bearer":
            return f"Bearer {self._fetch_token(challenge.params)}"
        if challenge.scheme != "basic":
            raise ImportFailed(f"{self.reference}: {self.reference.registry} asks for a "
                               f"login this client cannot give "
                               f"({challenge.scheme or 'no challenge'})")
        if self.credentials is None:
            raise ImportFailed(f"{self.reference}: {self.reference.registry} asks for a login;"
                               " give --creds USER or an auth file with an entry for it "
                               f"(--authfile){self._no_home()}")
        return self.credentials.basic()

    def _no_home(self) -> str:
        """Why the home directory's auth files were not searched, if they were not."""
        return f" ({self.access.no_home})" if self.access.no_home else ""

    def _fetch_token(self, params: dict[str, str]) -> str:
        """A token from the challenge's realm, with the credentials if there are any (the
        realm may be another host: docker's token flow sends them there)."""
        try:
            realm = urllib.parse.urlsplit(params.get("realm", ""))
        except ValueError:  # "https://[::1": an unclosed IPv6 address
            realm = urllib.parse.urlsplit("")
        if realm.scheme not in ("http", "https") or not realm.netloc:
            raise ImportFailed(f"{self.reference}: the registry's token realm is not a URL")
        if "@" in realm.netloc:  # urllib would look USER:PASSWORD@HOST up in the DNS
            raise ImportFailed(f"{self.reference}: the registry's token realm "
                               f"{_shown(realm)} holds a USER:PASSWORD@ login; not used")
        self._check_realm_scheme(realm)
        query = urllib.parse.urlencode({k: v for k, v in params.items()
                                        if k in ("service", "scope")})
        url = realm._replace(query="&".join(p for p in (realm.query, query) if p)).geturl()
        request = urllib.request.Request(url)
        if self.credentials:
            request.add_unredirected_header("Authorization", self.credentials.basic())
        try:
            with self.opener.open(request, timeout=TIMEOUT) as response:
                answer = json.loads(response.read(MAX_MANIFEST))
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in (401, 403):
                raise self._refused(exc.code, _netloc(realm)) from None
            raise ImportFailed(f"{self.reference}: the token service answered HTTP "
                               f"{exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException,
                RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise ImportFailed(f"{self.reference}: no token from {_shown(realm)}: "
                               f"{_reason(exc)}") from None
        token = answer.get("token") or answer.get("access_token") if isinstance(
            answer, dict) else None
        if not isinstance(token, str) or not token:
            raise ImportFailed(f"{self.reference}: the token service sent no token")
        if not TOKEN_RE.fullmatch(token):  # a CR/LF would break (or add to) our headers
            raise ImportFailed(f"{self.reference}: the token service sent a token that is "
                               "not printable ASCII")
        return token

    def _check_realm_scheme(self, realm: urllib.parse.SplitResult) -> None:
        """A plain HTTP realm: anonymous on loopback or with --insecure; credentials only
        when the registry itself is plain HTTP (loopback or --insecure) too."""
        if realm.scheme != "http":
            return
        if not (self.insecure or _loopback_host(realm.hostname)):
            raise ImportFailed(f"{self.reference}: the token realm {_shown(realm)} is plain "
                               "HTTP (use --insecure to allow it)")
        if self.credentials and self.scheme != "http":
            raise ImportFailed(f"{self.reference}: the token realm {_shown(realm)} is plain "
                               f"HTTP while {self.reference.registry} is HTTPS; the login is "
                               "not sent there")

    def manifest(self, ref: str) -> tuple[bytes, str]:
        """(bytes, Content-Type) of a manifest or index, refused past MAX_MANIFEST."""
        with self.get("manifests", ref, ACCEPT) as response, \
                self.reading(f"the manifest {ref}"):
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > MAX_MANIFEST:
                raise ImportFailed(f"{self.reference}: the manifest is larger than "
                                   f"{MAX_MANIFEST >> 20} MiB")
            data = response.read(MAX_MANIFEST + 1)
            said = response.headers.get("Docker-Content-Digest")
        verify_document(data, said if said and said.startswith("sha256:") else None,
                        str(self.reference))
        return data, response.headers.get("Content-Type", "")

    def blob(self, digest: str) -> BinaryIO:
        return self.get("blobs", digest)


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Follow a registry's redirects (blob storage elsewhere), never from HTTPS to plain
    HTTP off loopback unless insecure."""

    def __init__(self, insecure: bool):
        self.insecure = insecure

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        target = urllib.parse.urlsplit(urllib.parse.urljoin(req.full_url, newurl))
        if target.scheme != "https" and not (self.insecure or _loopback_host(target.hostname)):
            raise ImportFailed(f"the registry redirected to plain HTTP ({_netloc(target)}); "
                               "use --insecure to allow it")
        if "@" in target.netloc:  # urllib would look USER:PASSWORD@HOST up in the DNS
            raise ImportFailed(f"the registry redirected to a URL holding a USER:PASSWORD@ "
                               f"login ({_netloc(target)}); not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _netloc(url: urllib.parse.SplitResult) -> str:
    """host[:port] of a URL, without the USER:PASSWORD@ a storage URL may carry."""
    return url.netloc.rpartition("@")[2]


def _shown(url: urllib.parse.SplitResult) -> str:
    """The URL for a message: without USER:PASSWORD@."""
    return url._replace(netloc=_netloc(url)).geturl()


def _reason(exc: BaseException) -> str:
    """urllib's reason, or the http.client exception's name and text (a BadStatusLine
    is only the line the peer sent)."""
    if isinstance(exc, http.client.HTTPException):
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    return str(getattr(exc, "reason", exc))


def _loopback_host(host: str | None) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (urlsplit's hostname: no brackets, lower case)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def pull(reference: Reference, target: LayoutWriter, access: Access | None = None,
         progress=lambda event: None) -> str:
    """Copy the linux/amd64 image of `reference` into `target`; returns its manifest digest."""
    client = Client(reference, access)
    what = str(reference)
    data, kind, digest = _resolve(client, reference.ref, what)
    blobs = check_manifest(verify_document(data, digest, what), kind, what)
    for number, blob in enumerate(blobs):
        event = {"index": number + 1, "count": len(blobs), "kind": "pull",
                 "description": f"{'config' if number == 0 else 'layer'} {blob['digest'][:19]}"}
        if target.has(blob):
            progress({**event, "status": "present", "size": blob["size"]})
            continue
        progress({**event, "status": "fetching"})
        with client.blob(blob["digest"]) as stream, client.reading(f"blob {blob['digest']}"):
            target.put(blob, stream, what)
        progress({**event, "status": "fetched", "size": blob["size"]})
    target.finish(data, kind, reference.ref)
    return digest


def _resolve(client: Client, ref: str, what: str) -> tuple[bytes, str, str]:
    """The image manifest behind a tag or digest, through at most 4 indexes."""
    expected = ref if ref.startswith("sha256:") else None
    for _ in range(5):
        data, header = client.manifest(ref)
        doc = verify_document(data, expected, what)
        kind = media_type(doc, header)
        if kind not in INDEXES:
            return data, kind, "sha256:" + hashlib.sha256(data).hexdigest()
        ref = expected = check_digest(pick_platform(doc, what).get("digest"))
    raise ImportFailed(f"{what}: indexes nested too deep")
