"""Fixtures of the unit tests of the logic that uses a store."""

import pytest

from provisiond.state import open as opening
from tests.memstore import MemoryStore


@pytest.fixture
def store(monkeypatch) -> MemoryStore:
    """Every open_store of the test gives this one dict-backed store (the contract and
    files-store tests define a `store` of their own)."""
    shared = MemoryStore()
    monkeypatch.setattr(opening, "open_store", lambda config: shared)
    return shared
