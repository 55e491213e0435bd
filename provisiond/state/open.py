"""The store a process uses: `open_store(config)`.

Files under the state directory unless the `store:` setting names an etcd cluster. One
store per process and URL, opened on first use; a process forked after that (gunicorn's
workers) opens its own, since connections and their threads do not survive a fork.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from provisiond.config import Config, StoreAuthSettings, StoreTlsSettings
from provisiond.errors import InvalidConfig
from provisiond.state.store import Store
from provisiond.state.layout import Layout

"""`<state>/store.key`: the key encrypting secret values in etcd (never stored in etcd)."""

_opened: dict[str, Store] = {}
_opened_by = os.getpid()
_lock = threading.Lock()


def open_store(config: Config) -> Store:
    """This process's store for `config` (the same object on every call)."""
    url = config.store or f"files://{config.state_dir}"
    return opened(url, key_path=Layout.of(config).store_key, tls=config.store_tls,
                  auth=config.store_auth)


def opened(url: str, key_path: Path | None = None, tls: StoreTlsSettings | None = None,
           auth: StoreAuthSettings | None = None) -> Store:
    """The store at `url` (as `auth`, over `tls`), one per process: a store inherited
    through fork is dropped (not closed: its connections belong to the parent)."""
    global _opened_by
    name = (url, repr(tls), repr(auth))
    with _lock:
        if _opened_by != os.getpid():
            _opened.clear()
            _opened_by = os.getpid()
        store = _opened.get(name)
        if store is None:
            store = _opened[name] = open_url(url, key_path, tls, auth)
        return store


def open_url(url: str, key_path: Path | None = None, tls: StoreTlsSettings | None = None,
             auth: StoreAuthSettings | None = None) -> Store:
    """A new store for `url`: `files:///state/dir` or `etcd[s]://host:port[,host:port...]
    [/root/]` (`key_path`: the key file of secret values in etcd, required there; `tls`,
    `auth`: store_tls and store_auth)."""
    scheme = url.partition("://")[0]  # not urlsplit: Debian's refuses two hosts with [::1]
    if scheme == "files":
        from provisiond.state.files import FilesStore

        return FilesStore(Path(url.removeprefix("files://")))
    if scheme in ("etcd", "etcds"):
        from provisiond.state.etcd import EtcdStore

        if key_path is None:
            raise InvalidConfig(f"{url}: an etcd store needs its key file (store.key)")
        return EtcdStore(url, key_path, tls=tls, auth=auth)
    raise InvalidConfig(f"store: {url!r} is neither files:///DIR nor etcd[s]://HOST:PORT[,...]")
