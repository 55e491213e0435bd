import pytest

from provisiond.state import open as opening
from tests.memstore import MemoryStore


@pytest.fixture
def store(monkeypatch) -> MemoryStore:
    """Every open_store of the test gives this one dict-backed store."""
    shared = MemoryStore()
    monkeypatch.setattr(opening, "open_store", lambda config: shared)
    return shared
