"""Stores for the contract tests: a files store in a tmp dir, an etcd store under a key root
of its own on one 3-member etcd cluster started for the whole test session."""

from __future__ import annotations

import uuid

import pytest

from provisiond.state.files import FilesStore
from provisiond.state.open import open_url
from tests.etcd_cluster import cluster_fixture


etcd_cluster = cluster_fixture("session")


@pytest.fixture
def files_store(tmp_path):
    store = FilesStore(tmp_path / "state")
    return store, store.url, tmp_path / "store.key"


@pytest.fixture
def etcd_store(etcd_cluster, tmp_path):
    url = etcd_cluster.url(f"/test-{uuid.uuid4().hex[:12]}")
    key_path = tmp_path / "store.key"
    store = open_url(url, key_path)
    yield store, url, key_path
    store.close()
