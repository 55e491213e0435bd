"""TEMPORARY stand-in until storecore's open.py is merged (replaced by theirs at merge)."""

from __future__ import annotations

from provisiond.config import Config
from provisiond.state.store import Store


def open_store(config: Config) -> Store:
    from provisiond.state.files import FilesStore  # storecore's
    return FilesStore(config.state_dir)
