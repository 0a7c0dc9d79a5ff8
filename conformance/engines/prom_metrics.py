"""A server's `/metrics` body read with Prometheus' own parser (prometheus_client, which vLLM depends on):
label values with escaped quotes or braces, sample timestamps and the OpenMetrics format (`# EOF`) are read
as Prometheus reads them, not as a regex guesses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPENMETRICS_TYPE = "application/openmetrics-text"


class MetricsError(ValueError):
    """The body is not Prometheus text or OpenMetrics; the message is one sentence."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None


def parse(text: str, content_type: str = "") -> list[Sample]:
    """Every sample of the body; OpenMetrics when the content type says so, else the Prometheus text format
    (whose parser takes a trailing `# EOF` as a comment)."""
    try:
        if content_type.split(";")[0].strip().lower() == OPENMETRICS_TYPE:
            from prometheus_client.openmetrics.parser import text_string_to_metric_families
        else:
            from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise MetricsError(f"cannot read /metrics: prometheus_client is not installed ({exc}); vLLM depends "
                           "on it, install it.") from None
    try:
        return [Sample(s.name, dict(s.labels), float(s.value), None if s.timestamp is None else float(s.timestamp))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError) as exc:
        kind = "OpenMetrics" if OPENMETRICS_TYPE in content_type else "Prometheus text"
        raise MetricsError(f"the /metrics body is not valid {kind} ({exc}).") from None


def values(samples: list[Sample], name: str, labels: Mapping[str, str] | None = None) -> list[float]:
    """The values of the samples called `name` whose labels include `labels`."""
    want = dict(labels or {})
    return [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]
