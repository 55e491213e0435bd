"""A firmware image's URL: its check, and the user and password it may hold kept out of what
is shown, stored or logged (the BMC alone gets them: SimpleUpdate's ImageURI).

A URL's credentials are `scheme://USER:PASSWORD@host/...` (RFC 3986 userinfo: up to the
last '@' before the first '/', '?' or '#'); a password holding one of those must be
percent-encoded, as `with_password` does. A URL's query is one too: a pre-signed URL's
(S3's X-Amz-Signature, a SAS token's sig) lets whoever holds it fetch the image, so it is
kept apart and shown as `?***`, as a password is.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from urllib.parse import quote, unquote

from provisiond.config import CONTROL_RE
from provisiond.errors import InvalidInput

HIDDEN = "***"
_AUTHORITY_END = re.compile(r"[/?#]")


def check_firmware_url(url: str) -> None:
    """InvalidInput, naming the URL without its credentials, unless it is http(s) with no
    blank or control character, and a port that is a number."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not rest or CONTROL_RE.search(url) \
            or " " in url:
        raise InvalidInput(f"firmware image {without_credentials(url)!r}: not an http(s) URL")
    if not _port(rest).isdigit() and _port(rest) != "":
        # https://USER:PASS/WORD@host: the authority ends at the '/', so the URL seems to
        # hold no password and would be stored whole: quote none of it
        raise InvalidInput(f"firmware image {scheme}://...: the port after the host is not a "
                           "number (a password holding '/', '?' or '#' must be "
                           "percent-encoded: %2F, %3F, %23)")


def _port(rest: str) -> str:
    """The port of the authority that starts `rest` (a URL after its '://'); '' if none."""
    end = _AUTHORITY_END.search(rest)
    host = (rest[:end.start()] if end else rest).rpartition("@")[2]
    if host.startswith("["):  # an IPv6 address: [fd00::1]:8443
        return host.partition("]")[2].removeprefix(":")
    return host.rpartition(":")[2] if ":" in host else ""


def _split(url: str) -> tuple[str, str, str]:
    """(everything before the userinfo, the userinfo, everything after its '@'); the
    userinfo is '' when there is none. Also for text that is no URL (a check's message)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = _AUTHORITY_END.search(rest)
    authority = rest[:end.start()] if end else rest
    userinfo, at, _host = authority.rpartition("@")
    return scheme + sep, userinfo, rest[len(userinfo) + len(at):]


def _query(url: str) -> str:
    """The URL's query: after the first '?', before the '#' (none in a userinfo: '?' ends
    the authority); '' when there is none."""
    return url.partition("#")[0].partition("?")[2]


def without_credentials(url: str) -> str:
    """The URL without its user and password, its query hidden
    (http://u:p@h/f.bin?sig=x -> http://h/f.bin?***)."""
    head, _, tail = _split(url)
    query = _query(tail)
    if query:
        path, _, rest = tail.partition("?")
        tail = f"{path}?{HIDDEN}{rest[len(query):]}"
    return head + tail


def has_credentials(url: str) -> bool:
    """Whether the URL holds a user, a password or a query (one hidden already is none)."""
    return bool(_split(url)[1]) or _query(url) not in ("", HIDDEN)


def hide_credentials(text: str, url: str) -> str:
    """`text` (a BMC's message, an exception's) with `url` shown without its credentials,
    and its password and query, as written in the URL or decoded, wherever else they
    appear."""
    userinfo, query = _split(url)[1], _query(url)
    if not userinfo and not query:
        return text
    text = text.replace(url, without_credentials(url))
    if userinfo:
        text = text.replace(userinfo + "@", "")
    password = userinfo.partition(":")[2]
    forms = {password, unquote(password), query, unquote(query)} - {"", HIDDEN}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, HIDDEN)
    return text


@contextlib.contextmanager
def credentials_hidden(url: str) -> Iterator[None]:
    """An exception leaving the block loses `url`'s credentials from its message, before a
    caller cuts the message short (a cut inside the password leaves a part of it that no
    longer matches the whole)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        hidden = hide_credentials(text, url)
        if hidden != text:
            exc.args = (hidden,)
        raise


class _Hiding(logging.Filter):
    """A log record's text (message, traceback) with a URL's credentials hidden."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = hide_credentials(message, self.url)
        if hidden != message:
            record.msg, record.args = hidden, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = hide_credentials(record.exc_text, self.url)
        return True


@contextlib.contextmanager
def credentials_hidden_in_logs(url: str) -> Iterator[None]:
    """What this process logs in the block (a library's warning quoting a BMC's message,
    which may quote the URL: sushy's before a retry) without `url`'s credentials: a job's
    runner logs to a file other local users may read."""
    hiding, handlers = _Hiding(url), list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(hiding)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(hiding)


def user_without_password(url: str) -> str:
    """The user `url` names, to give a password to; InvalidInput if it names none, or a
    password already."""
    userinfo = _split(url)[1]
    if not userinfo:
        raise InvalidInput(f"firmware image {without_credentials(url)!r}: a password needs "
                           "a user in the URL "
                           "(https://USER@host/file)")
    if ":" in userinfo:
        raise InvalidInput(f"firmware image {without_credentials(url)!r}: the URL holds a "
                           "password already: give it once")
    return unquote(userinfo)


def with_password(url: str, password: str) -> str:
    """`url`, which names a user and no password, with `password` (percent-encoded)."""
    user_without_password(url)
    head, userinfo, tail = _split(url)
    return f"{head}{userinfo}:{quote(password, safe='')}@{tail}"
