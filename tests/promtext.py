"""Reading Prometheus text exposition in tests: samples by (name, labels), shared by the unit and integration
tests of ``/metrics``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["samples", "value"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample in ``text``, keyed by its name and its sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``, or 0 when absent (a counter not yet incremented)."""
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)
