"""Shared state: every path (layout), the documents the parts exchange (models), and the store
they go through (files by default, etcd for several servers). See docs/contracts.md."""
