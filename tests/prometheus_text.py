"""Reading metrics back as Prometheus reads them: the text format, parsed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple], float]


def parse(text: str) -> Samples:
    """{(sample name, sorted (label, value) pairs): value} of a /metrics answer."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def collected(collector) -> Samples:
    """What a collector (or a registry) exposes, through the text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """{value of `label`: sample value} of every `name` sample (a one-label counter)."""
    return {dict(labels)[label]: value for (sample, labels), value in samples.items()
            if sample == name}
