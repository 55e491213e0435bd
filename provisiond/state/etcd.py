"""The etcd backend: the store several boot servers share, over etcd's v3 JSON gateway
(`/v3/...`, etcd >= 3.4) through etcd3gw.

A store key `K` is the etcd key `ROOT + K` (ROOT from the URL, /provisiond/ by default);
revisions are etcd's mod_revision; compare-and-swap is a transaction comparing it (or
create_revision == 0 for ABSENT). Values of secret keys are sealed (provisiond.state.crypt)
with `<state>/store.key`, whose id (never the key) sits at `ROOT.key-id`.

Each call tries the members in turn (the one that answered last first) until one serves
it, for at most RETRY_FOR seconds: a stopped member or a leader election costs a retry, not
a failed call. When no member takes a connection at all for UNREACHABLE_FOR seconds (the
cluster is down, or the URL is wrong), the call fails then, and at once when every member
failed the TLS handshake (a wrong CA, a client certificate missing or refused).

`etcds://` speaks TLS to the members (store_tls: the CA, the client certificate); with
store_auth, requests carry the token of an etcd user (`/v3/auth/authenticate`), one per
member (etcd's simple tokens are known to the member that gave them only), renewed when the
member no longer knows it (expired after --auth-token-ttl, or the member restarted).

A compare-and-swap whose answer was lost (the member died after taking it) must not be
sent again blindly: it carries a receipt, a key of its own under `ROOT.receipts/` written
in the same transaction on a short lease, and a retry first asks whether the receipt
exists (then the write was applied, and its revision is the receipt's).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import etcd3gw
import requests
import urllib3
from etcd3gw import exceptions as etcd_errors

from provisiond.config import StoreAuthSettings, StoreTlsSettings, parse_store_url
from provisiond.errors import InvalidConfig, ProvisiondError, StaleRevision, TooLarge, Unavailable
from provisiond.state import crypt
from provisiond.state.keys import check_expect, check_key, check_prefix, is_secret
from provisiond.state.store import ABSENT, Change, Compacted, Entry, Store

REQUEST_TIMEOUT = 10.0  # seconds for one member to answer one request
CONNECT_TIMEOUT = 3.0
RETRY_FOR = 30.0  # seconds a call keeps trying members (an election takes a few)
UNREACHABLE_FOR = 5.0
"""Seconds a call keeps trying when no member takes a connection: a member restarted (by
hand or by systemd) listens again within 1-2 s, and one stopped member never counts (the
others answer); a cluster that is entirely down or a wrong URL fails in 5 s, not 30."""
RECEIPT_TTL = 60  # seconds a receipt lives; a lease serves receipts for RECEIPT_RENEW
RECEIPT_RENEW = 20.0
TOO_LARGE = ("request is too large", "received message larger than max")
"""etcd's answers to a value over --max-request-bytes (the second when it is also over the
gRPC limit, 512 KiB more)."""
LEASE_GONE = "requested lease not found"
TOKEN_GONE = ("invalid auth token", "user name is empty")
"""etcd's answers to a request whose token it does not know (expired, or given by another
member or before a restart) or that carries none (authentication enabled since)."""
DENIED = "permission denied"
AUTH_FAILED = "authentication failed"
AUTH_OFF = "authentication is not enabled"
MAX_PASSWORD = 4096
COMMON_NAME = "CommonName of client sending a request against gateway"


_UNSET = object()
"""No token taken from the member yet."""


class _Retry(Exception):
    """A member failed a request another member may serve."""


class _Unreachable(_Retry):
    """No connection to a member: refused, timed out, no such host, or a TLS handshake
    failed (`settled`: not something a retry mends)."""

    def __init__(self, message: str, settled: bool = False):
        super().__init__(message)
        self.settled = settled
        self.at = time.monotonic()


class _LeaseGone(Exception):
    pass


class _TokenGone(Exception):
    """The member does not know the request's token (or it carried none)."""


class _Denied(Exception):
    """etcd refused the user: a wrong password, or a permission its role lacks."""


class StoreDenied(ProvisiondError):
    """etcd refused the store's user: a wrong password, a role without the permission, or
    authentication required and no user set."""

    code = "store_denied"
    http_status = 503


Reply = dict


class EtcdStore(Store):
    remote = True

    def __init__(self, url: str, key_path: Path, timeout: float = REQUEST_TIMEOUT,
                 tls: StoreTlsSettings | None = None, auth: StoreAuthSettings | None = None):
        try:
            endpoints, root, uses_tls = parse_store_url(url)
        except ValueError as exc:
            raise InvalidConfig(f"store: {exc}") from None
        if tls is not None and not uses_tls:
            raise InvalidConfig(f"store_tls: for an etcds:// store, not {url}")
        self.url = url
        self.root = root.encode()
        self.key_path = Path(key_path)
        self.auth = auth
        self._password = read_password(auth) if auth else None
        verify, cert = tls_files(tls or StoreTlsSettings()) if uses_tls else (True, None)
        # connect within CONNECT_TIMEOUT: a member whose host is down (no answer, not even
        # a refusal) costs 3 s, not the whole request timeout
        self.clients = [etcd3gw.client(host=host, port=port, api_path="/v3/",
                                       timeout=(min(CONNECT_TIMEOUT, timeout), timeout),
                                       protocol="https" if uses_tls else "http",
                                       session=_session(verify, cert))
                        for host, port in endpoints]
        self._preferred = 0
        self._lease: tuple[int, float] | None = None
        self._box: crypt.SecretBox | None = None
        self._tokens: dict[object, str | None] = {}  # etcd3gw client: its member's token
        self._renewing = {client: threading.Lock() for client in self.clients}
        self._renewal_failed: dict[object, tuple[float, _Retry]] = {}
        self._granting = threading.Lock()  # held while the receipts' lease is granted
        self._grants: tuple[int, Exception | None] = (0, None)  # grants tried, the last's error

    # reads

    def get(self, key: str) -> Entry | None:
        reply = self._call("kv/range", {"key": _b64(self._key(check_key(key)))}, what=key)
        kvs = reply.get("kvs")
        return self._entry(kvs[0]) if kvs else None

    def list(self, prefix: str) -> list[Entry]:
        start = self._key(check_prefix(prefix))
        reply = self._call("kv/range", {"key": _b64(start), "range_end": _b64(_end(start)),
                                        "sort_order": "ASCEND", "sort_target": "KEY"},
                           what=f"the keys under {prefix or '/'}")
        return [self._entry(kv) for kv in reply.get("kvs", [])]

    def revision(self) -> int:
        reply = self._call("kv/range", {"key": _b64(self.root), "count_only": True})
        return int(reply["header"]["revision"])

    def watch(self, prefix: str, since: int, timeout: float) -> list[Change]:
        start = self._key(check_prefix(prefix))
        body = {"create_request": {"key": _b64(start), "range_end": _b64(_end(start)),
                                   "start_revision": since + 1}}
        if self._put_since(start, since):  # etcd hands them over in 0.1 s, not at once
            timeout = max(timeout, REQUEST_TIMEOUT)
        deadline = time.monotonic() + timeout
        return self._each_member(lambda client: self._as_user(
            client, lambda token: self._watch_on(client, body, deadline, token),
            f"a watch of {prefix}"))

    def _put_since(self, start: bytes, since: int) -> bool:
        """Whether a key under `start` was written after `since` (and is still there)."""
        reply = self._call("kv/range", {"key": _b64(start), "range_end": _b64(_end(start)),
                                        "min_mod_revision": since + 1, "count_only": True})
        return int(reply.get("count", 0)) > 0

    # writes

    def put(self, key: str, value: bytes, expect: int | None = None) -> int:
        name = self._key(check_key(key))
        request = {"key": _b64(name), "value": _b64(self._sealed(key, bytes(value)))}
        try:
            if expect is None:
                return _revision(self._call("kv/put", request, what=key))
            return _revision(self._guarded(key, expect, {"request_put": request}))
        except TooLarge:
            raise TooLarge(f"{key}: {len(value) / 2**20:.1f} MiB is more than the etcd cluster "
                           "takes in one request: start its members with a larger "
                           "--max-request-bytes (docs/store.md)") from None

    def delete(self, key: str, expect: int | None = None) -> bool:
        name = _b64(self._key(check_key(key)))
        if expect is None:
            return int(self._call("kv/deleterange", {"key": name}).get("deleted", 0)) > 0
        reply = self._guarded(key, expect, {"request_delete_range": {"key": name}})
        responses = reply.get("responses")
        if not responses:  # applied by an attempt whose answer was lost
            return expect != ABSENT
        return int(responses[0]["response_delete_range"].get("deleted", 0)) > 0

    def compact(self, revision: int) -> None:
        """Drop the history before `revision` (etcd keeps every revision until compacted;
        a watch from before it is Compacted)."""
        self._call("kv/compaction", {"revision": revision})

    def close(self) -> None:
        for client in self.clients:
            client.session.close()

    # compare-and-swap with a receipt

    def _guarded(self, key: str, expect: int, operation: dict) -> Reply:
        """Run `operation` if `key` is at `expect`; StaleRevision otherwise."""
        name = _b64(self._key(key))
        if expect == ABSENT:
            compare = {"key": name, "target": "CREATE", "result": "EQUAL", "create_revision": 0}
        else:
            compare = {"key": name, "target": "MOD", "result": "EQUAL", "mod_revision": expect}
        for _ in range(2):
            try:
                reply = self._with_receipt(compare, operation, name, key)
            except _LeaseGone:
                self._lease = None  # etcd lost it (restored from a backup?): a new one
                continue
            if reply.get("succeeded"):
                return reply
            kvs = reply["responses"][0]["response_range"].get("kvs")
            check_expect(key, int(kvs[0]["mod_revision"]) if kvs else None, expect)
            raise StaleRevision(f"{key}: changed while written, expected revision {expect}")
        raise Unavailable(f"{self.url}: etcd keeps losing the lease of write receipts")

    def _with_receipt(self, compare: dict, operation: dict, name: str, key: str) -> Reply:
        receipt = _b64(self.root.rstrip(b"/") + b".receipts/" + uuid.uuid4().hex.encode())
        txn = {"compare": [compare],
               "success": [operation, {"request_put": {"key": receipt, "value": "",
                                                       "lease": self._lease_id()}}],
               "failure": [{"request_range": {"key": name, "keys_only": True}}]}
        retried = []

        def applied_before(client) -> Reply | None:
            retried.append(True)
            return self._receipt(client, receipt)

        reply = self._call("kv/txn", txn, what=key, before_retry=applied_before)
        if not reply.get("succeeded") and retried:
            # an attempt whose answer was lost may have been applied after all
            applied = self._each_member(lambda client: self._receipt(client, receipt))
            return applied or reply
        return reply

    def _receipt(self, client, receipt: str) -> Reply | None:
        """A reply as of a successful write when the receipt exists, else None."""
        reply = self._send(client, "kv/range", {"key": receipt})
        kvs = reply.get("kvs")
        if not kvs:
            return None
        return {"succeeded": True, "header": {"revision": kvs[0]["mod_revision"]}}

    def _lease_id(self) -> int:
        """The lease of this store's receipts, granted by one caller at a time: writers at
        once (a storm's first credentials) each granted one, 20 writers 20 leases. Those
        that waited for a grant that failed fail with it (the store is away: each trying
        in turn, the 20th failed after 20 times the wait)."""
        grants = self._grants
        with self._granting:
            lease = self._lease
            if lease and time.monotonic() < lease[1]:
                return lease[0]
            if self._grants[0] != grants[0] and self._grants[1] is not None:
                raise self._grants[1]
            try:
                reply = self._call("lease/grant", {"TTL": RECEIPT_TTL, "ID": 0})
            except Exception as exc:
                self._grants = (self._grants[0] + 1, exc)
                raise
            self._lease = (int(reply["ID"]), time.monotonic() + RECEIPT_RENEW)
            self._grants = (self._grants[0] + 1, None)
            return self._lease[0]

    # talking to members

    def _call(self, path: str, body: dict, what: str = "",
              before_retry: Callable[[object], Reply | None] | None = None) -> Reply:
        """POST `body` to the members in turn until one answers (RETRY_FOR seconds)."""
        attempts = []

        def request(client) -> Reply:
            if attempts and before_retry:
                found = before_retry(client)
                if found is not None:
                    return found
            attempts.append(client)
            return self._send(client, path, body, what)

        return self._each_member(request)

    def _each_member(self, request: Callable[[object], Reply]):
        deadline = time.monotonic() + RETRY_FOR
        failures: list[str] = []
        unreachable: list[_Unreachable] = []  # the failures since a member last answered
        count = len(self.clients)
        for attempt in range(10_000):
            index = (self._preferred + attempt) % count
            client = self.clients[index]
            try:
                reply = request(client)
            except _Retry as exc:
                failures.append(f"{_member(client)}: {exc}")
                unreachable = unreachable + [exc] if isinstance(exc, _Unreachable) else []
            else:
                self._preferred = index
                return reply
            failed = self._none_reachable(unreachable)
            if failed is None and time.monotonic() > deadline:
                failed = f"no member served the request within {RETRY_FOR:g} s"
            if failed is not None:
                raise Unavailable(f"etcd {self.url}: {failed} ({'; '.join(failures[-count:])})")
            if (attempt + 1) % count == 0:  # every member failed this round
                time.sleep(min(0.05 * 2 ** ((attempt + 1) // count), 1.0))
        raise Unavailable(f"etcd {self.url}: no member served the request")

    def _none_reachable(self, unreachable: list[_Unreachable]) -> str | None:
        """Why to give up, if so: every member failed its TLS handshake in the last round,
        or none took a connection for UNREACHABLE_FOR seconds."""
        count = len(self.clients)
        if len(unreachable) < count:
            return None
        if all(exc.settled for exc in unreachable[-count:]):
            return "no member completed the TLS handshake"
        if time.monotonic() - unreachable[0].at <= UNREACHABLE_FOR:
            return None
        hint = ""
        if self.url.startswith("etcd://") and all(str(exc) == CLOSED for exc in unreachable):
            hint = " (members that speak TLS close plain connections: etcds://?)"
        return f"no member took a connection for {UNREACHABLE_FOR:g} s{hint}"

    # as the store's etcd user

    def _send(self, client, path: str, body: dict, what: str = "") -> Reply:
        """One request to one member, as the store's user."""
        return self._as_user(client, lambda token: _post(client, path, body, what, token),
                             what or path)

    def _as_user(self, client, send: Callable[[str | None], Reply], what: str):
        """`send(token)` with the member's token for the store's user, renewed once when
        the member no longer knows it; StoreDenied when etcd refuses the user."""
        token = self._token(client, stale=_UNSET)
        try:
            return send(token)
        except _TokenGone as exc:
            if self.auth is None:
                raise StoreDenied(f"etcd {self.url} requires a user ({exc}): set store_auth "
                                  "(docs/store.md)") from None
        except _Denied:
            raise self._denied(what) from None
        token = self._token(client, stale=token)
        try:
            return send(token)
        except (_TokenGone, _Denied):
            raise self._denied(what) from None

    def _token(self, client, stale) -> str | None:
        """The member's token, a new one when it is still `stale` (the one it refused; one
        renewal however many threads found out at once: each is a bcrypt and a raft write
        in etcd; a renewal that failed, the member away, fails the threads that waited for
        it: they try the next member, not the same one in turn). Each request carries its
        token: none ever goes without while another thread renews."""
        if self.auth is None:
            return None
        waited_from = time.monotonic()
        with self._renewing[client]:
            if self._tokens.get(client, _UNSET) is not stale:
                return self._tokens[client]
            failed = self._renewal_failed.get(client)
            if failed is not None and failed[0] >= waited_from:
                raise failed[1]  # the renewal this thread waited for: the member is away
            try:
                self._authenticate(client)
            except _Retry as exc:
                self._renewal_failed[client] = (time.monotonic(), exc)
                raise
            return self._tokens[client]

    def _authenticate(self, client) -> None:
        """Take a token for the store's user from `client`'s member (none when etcd has
        authentication off: what etcd's own client does)."""
        body = {"name": self.auth.user, "password": self._password}
        try:
            reply = _post(client, "auth/authenticate", body)
        except _Denied:
            raise StoreDenied(f"etcd {self.url}: user {self.auth.user!r} was refused: a wrong "
                              "user name or password (store_auth.password_file "
                              f"{self.auth.password_file})") from None
        except (ProvisiondError, _TokenGone) as exc:
            if AUTH_OFF not in str(exc):
                raise
            self._tokens[client] = None
            return
        self._tokens[client] = reply["token"]

    def _denied(self, what: str) -> StoreDenied:
        who = f"user {self.auth.user!r}" if self.auth else "no user (store_auth)"
        prefix = self.root.rstrip(b"/").decode()
        return StoreDenied(f"etcd {self.url}: permission denied to {who} for {what}: its role "
                           f"needs readwrite on the keys starting with {prefix} "
                           "(docs/store.md)")

    def _watch_on(self, client, body: dict, deadline: float,
                  token: str | None) -> list[Change]:
        """The first changes the member streams; [] at the deadline."""
        left = max(deadline - time.monotonic(), 0.01)
        try:
            with client.session.post(client.get_url("watch"), json=body, stream=True,
                                     headers=_authorization(token),
                                     timeout=(CONNECT_TIMEOUT, left)) as reply:
                if reply.status_code != 200:
                    _refusal(_message_of(reply.text))
                    raise _Retry(f"HTTP {reply.status_code}: {reply.text[:200]}")
                for line in reply.iter_lines():
                    changes = self._watch_message(line)
                    if changes or time.monotonic() > deadline:
                        return changes
        except requests.exceptions.RequestException as exc:
            if not _timed_out(exc):
                raise _failed_connection(exc) from None
            return []
        raise _Retry("the watch stream ended")

    def _watch_message(self, line: bytes) -> list[Change]:
        if not line.strip():
            return []
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise _Retry(f"the watch answered what is not JSON: {line[:80]!r}") from None
        if not (isinstance(message, dict)
                and isinstance(message.get("error", message.get("result")), dict)):
            raise _Retry(f"the watch answered JSON that is not etcd's: {line[:80]!r}")
        if "error" in message:
            _refusal(message["error"].get("message", ""))
            raise _Retry(message["error"].get("message", "watch failed"))
        result = message["result"]
        if int(result.get("compact_revision", 0)):
            raise Compacted(f"{self.url}: changes before revision "
                            f"{result['compact_revision']} were compacted")
        if result.get("canceled"):
            reason = result.get("cancel_reason") or "watch canceled"
            if DENIED in reason:  # also what a watch with a token etcd forgot gets (3.4)
                raise _TokenGone(reason)
            raise _Retry(reason)
        return [self._change(event) for event in result.get("events", [])]

    # keys and values

    def _key(self, key: str) -> bytes:
        return self.root + key.encode()

    def _name(self, kv: dict) -> str:
        return base64.b64decode(kv["key"])[len(self.root):].decode()

    def _entry(self, kv: dict) -> Entry:
        key = self._name(kv)
        value = self._opened(key, base64.b64decode(kv.get("value", "")))
        return Entry(key, value, int(kv["mod_revision"]))

    def _change(self, event: dict) -> Change:
        kv = event["kv"]
        key = self._name(kv)
        if event.get("type") == "DELETE":
            return Change(key, int(kv["mod_revision"]), None)
        return Change(key, int(kv["mod_revision"]),
                      self._opened(key, base64.b64decode(kv.get("value", ""))))

    def _sealed(self, key: str, value: bytes) -> bytes:
        return self._secrets().seal(key, value) if is_secret(key) else value

    def _opened(self, key: str, value: bytes) -> bytes:
        return self._secrets().open(key, value) if is_secret(key) else value

    def _secrets(self) -> crypt.SecretBox:
        """The key of secret values: the key file, created (with the store's key id) when
        neither exists; a store sealed with another key is refused."""
        if self._box is None:
            key = crypt.read_key(self.key_path)
            marker = self._key_id()
            if key is None and marker is not None:
                raise crypt.StoreKeyError(
                    f"{self.key_path} is missing, and the secrets in {self.url} are sealed "
                    f"with store key {marker}: copy store.key from a server of this store")
            if key is None:
                key = crypt.create_key(self.key_path)
            if marker is None:
                marker = self._claim_key_id(crypt.key_id(key).hex())
            if marker != crypt.key_id(key).hex():
                raise crypt.StoreKeyError(
                    f"{self.key_path} is store key {crypt.key_id(key).hex()}, but the "
                    f"secrets in {self.url} are sealed with store key {marker}: copy "
                    "store.key from a server of this store")
            self._box = crypt.SecretBox(key, self.key_path)
        return self._box

    def _key_id(self) -> str | None:
        reply = self._call("kv/range", {"key": _b64(self._marker)})
        kvs = reply.get("kvs")
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def _claim_key_id(self, key_id: str) -> str:
        """Record `key_id` as the store's unless one is recorded; returns the store's."""
        name = _b64(self._marker)
        self._call("kv/txn", {
            "compare": [{"key": name, "target": "CREATE", "result": "EQUAL",
                         "create_revision": 0}],
            "success": [{"request_put": {"key": name, "value": _b64(key_id.encode())}}]})
        return self._key_id()

    @property
    def _marker(self) -> bytes:
        return self.root.rstrip(b"/") + b".key-id"


def _post(client, path: str, body: dict, what: str = "", token: str | None = None) -> Reply:
    """One request to one member (with `token`); _Retry when another member may serve it."""
    try:
        return client.post(client.get_url(path), json=body, headers=_authorization(token))
    except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as exc:
        cause = exc.__context__
        if isinstance(cause, requests.exceptions.RequestException) and not _timed_out(cause):
            raise _failed_connection(cause) from None  # no HTTP answer
        message = _message(exc)
        if LEASE_GONE in message:
            raise _LeaseGone() from None
        raise _Retry(message) from None
    except requests.exceptions.RequestException as exc:  # not turned into etcd3gw's errors
        raise _failed_connection(exc) from None
    except OSError as exc:  # requests: "Could not find the TLS certificate file..." (gone
        raise _Unreachable(_short(exc), settled=True) from None  # since the store opened)
    except etcd_errors.InternalServerError as exc:
        message = _message(exc)
        if LEASE_GONE in message:
            raise _LeaseGone() from None
        raise _Retry(message) from None
    except etcd_errors.Etcd3Exception as exc:
        message = _message(exc)
        if any(words in message for words in TOO_LARGE):
            raise TooLarge(f"{what}: more than the etcd cluster takes in one request: "
                           "start its members with a larger --max-request-bytes "
                           "(docs/store.md)") from None
        if LEASE_GONE in message:
            raise _LeaseGone() from None
        if "compacted" in message:
            raise Compacted(f"etcd: {message}") from None
        _refusal(message)
        raise ProvisiondError(f"etcd refused a request{f' for {what}' if what else ''}: "
                              f"{message}") from None


def _member(client) -> str:
    """A member's HOST:PORT as in the URL ([::1]:2379, not ::1:2379)."""
    return client.base_url.partition("://")[2]


def _authorization(token: str | None) -> dict:
    return {"Authorization": token} if token else {}


def _refusal(message: str) -> None:
    """Raise what an authentication refusal in etcd's `message` means, if it is one."""
    if COMMON_NAME in message:
        raise StoreDenied("etcd refuses a client certificate with a Common Name when its "
                          "authentication is on (its gateway cannot pass the name on): use "
                          "one without (store_tls.cert_file; docs/store.md)")
    if any(words in message for words in TOKEN_GONE):
        raise _TokenGone(message)
    if DENIED in message or AUTH_FAILED in message:
        raise _Denied(message)


def _message(exc: etcd_errors.Etcd3Exception) -> str:
    """etcd's own message from an etcd3gw error (the gateway's JSON body)."""
    return _message_of(exc.detail_text or "") or type(exc).__name__


def _message_of(text: str) -> str:
    try:
        body = json.loads(text)
        return str(body.get("message") or body.get("error") or text)
    except (ValueError, AttributeError):
        return _short(text)


def _failed_connection(exc: requests.exceptions.RequestException) -> _Retry:
    """What a request that got no HTTP answer means: _Unreachable when no connection was
    made (refused, connect timeout, no such host, a TLS handshake failed)."""
    text = str(exc)
    if isinstance(exc, requests.exceptions.SSLError) or "SSLError" in text:
        # a connection ended mid-handshake may be a member stopping: not settled
        return _Unreachable(_tls_failure(text), settled="EOF occurred" not in text)
    if isinstance(exc, requests.exceptions.ConnectTimeout) or any(
            words in text for words in ("NewConnectionError", "NameResolutionError")):
        return _Unreachable(_short(exc))
    if isinstance(exc, requests.exceptions.ConnectionError) and _short(exc) == CLOSED:
        return _Unreachable(CLOSED)  # also what a member that speaks TLS does to plain HTTP
    return _Retry(_short(exc))


TLS_FAILURES = {
    "CERTIFICATE_VERIFY_FAILED": "TLS: the member's certificate does not verify against "
                                 "store_tls.ca_file, or does not name the address the URL "
                                 "gives ({})",
    "certificate required": "TLS: the member requires a client certificate "
                            "(store_tls.cert_file, key_file)",
    "EOF occurred": "TLS: the member ended the handshake: it wants a client certificate "
                    "signed by a CA of its --trusted-ca-file (store_tls.cert_file, key_file)",
    "unknown ca": "TLS: the member refused the client certificate: not signed by a CA of "
                  "its --trusted-ca-file",
    "bad certificate": "TLS: the member refused the client certificate, or wants one: "
                       "store_tls.cert_file and key_file, signed by a CA of its "
                       "--trusted-ca-file, not expired ({})",
    "WRONG_VERSION_NUMBER": "TLS: the member does not speak TLS (an etcd:// store?)",
}
"""OpenSSL's words in a failed handshake, and what they mean here."""


def _tls_failure(text: str) -> str:
    detail = re.search(r"\] ([^(']+)", text)
    detail = detail.group(1).strip() if detail else text.splitlines()[0][:200]
    for words, meaning in TLS_FAILURES.items():
        if words in text:
            return meaning.format(detail)
    return f"TLS: {detail}"


def _session(verify: str | bool, cert: tuple[str, str] | None) -> requests.Session:
    """A session of one member's client that the environment does not steer: requests
    would let $REQUESTS_CA_BUNDLE replace store_tls.ca_file, ~/.netrc the token, and
    $https_proxy send the store's traffic through a web proxy."""
    session = requests.Session()
    session.trust_env = False
    session.verify = verify
    session.cert = cert
    return session


def tls_files(settings: StoreTlsSettings) -> tuple[str | bool, tuple[str, str] | None]:
    """requests' `verify` and `cert` for `settings`, whose files are read and checked now
    (one line naming the setting at fault; requests reads them again per connection)."""
    context = ssl.create_default_context()
    verify: str | bool = True  # the system's CAs
    if settings.ca_file is not None:
        _readable("store_tls.ca_file", settings.ca_file)
        try:
            context.load_verify_locations(cafile=str(settings.ca_file))
        except ssl.SSLError as exc:
            raise InvalidConfig(f"store_tls.ca_file: {settings.ca_file}: no PEM certificate "
                                f"in it ({exc.reason or exc})") from None
        verify = str(settings.ca_file)
    if settings.cert_file is None:
        return verify, None
    _readable("store_tls.cert_file", settings.cert_file)
    _readable("store_tls.key_file", settings.key_file)
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file, password=_no_passphrase)
    except (ssl.SSLError, ValueError) as exc:
        raise InvalidConfig(
            f"store_tls.cert_file, key_file: {settings.cert_file}, {settings.key_file}: not "
            f"a PEM certificate and its unencrypted key ({getattr(exc, 'reason', None) or exc})"
        ) from None
    return verify, (str(settings.cert_file), str(settings.key_file))


def _no_passphrase() -> bytes:
    raise ValueError("the key is encrypted: provisiond takes an unencrypted key, mode 0600")


def _readable(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidConfig(f"{setting}: {path}: {exc.strerror or exc}") from None


def read_password(settings: StoreAuthSettings) -> str:
    """The etcd user's password: the first line of its file, which only its owner may read
    (the way ssh treats a private key)."""
    path = settings.password_file
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise InvalidConfig(f"store_auth.password_file: {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise InvalidConfig(f"store_auth.password_file: {path}: not a regular file")
    if mode & 0o077:
        raise InvalidConfig(f"store_auth.password_file: {path} is mode {mode & 0o777:04o}: "
                            f"others may read it; chmod 600 {path}")
    line = _readable("store_auth.password_file", path)[:MAX_PASSWORD].partition(b"\n")[0]
    try:  # etcd takes the password in JSON: text (a replaced byte: a wrong password)
        password = line.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError:
        raise InvalidConfig(f"store_auth.password_file: {path}: not UTF-8 text") from None
    if not password:
        raise InvalidConfig(f"store_auth.password_file: {path}: empty")
    return password


def _timed_out(exc: Exception) -> bool:
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    cause = exc.args[0] if exc.args else None
    return isinstance(cause, urllib3.exceptions.ReadTimeoutError)


CLOSED = "connection closed"
CONNECTION_FAILURES = {"NewConnectionError": "connection refused",
                       "timed out": "timed out", "RemoteDisconnected": CLOSED,
                       "Connection reset": "connection reset",
                       "Connection aborted": CLOSED}
"""requests' long texts (the pool, the URL, the cause) as a few words."""


def _short(value) -> str:
    text = str(value)
    for words, short in CONNECTION_FAILURES.items():
        if words in text:
            return short
    return text.splitlines()[0][:200] if text else ""


def _revision(reply: Reply) -> int:
    return int(reply["header"]["revision"])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _end(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix` (etcd's range_end)."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    end[-1] += 1
    return bytes(end)
