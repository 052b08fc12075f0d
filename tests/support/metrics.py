"""Reading prometheus-client counters in tests (the process's own registry)."""

from __future__ import annotations

from prometheus_client import Counter


def value(counter: Counter, **labels: str) -> float:
    """The counter's value for exactly these labels (0 when never incremented)."""
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == labels:
                return float(sample.value)
    return 0.0


def total(counter: Counter) -> float:
    """The counter summed over every label set."""
    return sum(
        float(s.value)
        for family in counter.collect()
        for s in family.samples
        if s.name.endswith("_total")
    )
