"""Latency quantiles from a Prometheus histogram scrape, and the cross-check with locust's.

The server measures each Translate call in `s2s_request_duration_seconds` (buckets, not samples), so
its quantiles are estimates: `histogram_quantile` interpolates linearly inside the bucket where the
quantile's rank falls, as PromQL's histogram_quantile() does. Locust measures every call on the
client side. The two agree when they fall in the same bucket or in neighbouring ones.

    from loadtest import prom
    before, after = prom.parse_histogram(scrape0), prom.parse_histogram(scrape1)
    hist = prom.subtract(after, before)           # the requests of this run only
    prom.compare(hist, {0.5: 87.0, 0.99: 540.0})  # locust's quantiles, in milliseconds
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

REQUEST_HISTOGRAM = "s2s_request_duration_seconds"
TRANSLATE_OK: dict[str, str] = {"method": "Translate", "code": "OK"}
QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: (upper bound, observations <= bound), sorted, ending with +Inf."""

    buckets: tuple[tuple[float, float], ...]
    sum: float = 0.0

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    @property
    def bounds(self) -> tuple[float, ...]:
        return tuple(le for le, _ in self.buckets)


def parse_histogram(
    text: str, name: str = REQUEST_HISTOGRAM, labels: Mapping[str, str] | None = None
) -> Histogram:
    """The histogram `name` from a scrape in the Prometheus text format.

    Series whose labels include `labels` (default: method="Translate", code="OK") are summed bucket
    by bucket, like `sum by (le) (name_bucket{labels})`. ValueError when no series matches.
    """
    wanted = dict(TRANSLATE_OK if labels is None else labels)
    counts: dict[float, float] = {}
    total = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if any(sample.labels.get(k) != v for k, v in wanted.items()):
                continue
            if sample.name == name + "_bucket":
                le = float(sample.labels["le"])
                counts[le] = counts.get(le, 0.0) + float(sample.value)
                found = True
            elif sample.name == name + "_sum":
                total += float(sample.value)
    if not found:
        shown = ",".join(f'{k}="{v}"' for k, v in wanted.items())
        raise ValueError(f"no {name}_bucket{{{shown}}} series in the scrape")
    return Histogram(tuple(sorted(counts.items())), total)


def subtract(after: Histogram, before: Histogram) -> Histogram:
    """The observations made between two scrapes of the same histogram (counters only grow)."""
    if after.bounds != before.bounds:
        raise ValueError(f"bucket bounds differ: {before.bounds} vs {after.bounds}")
    buckets = tuple(
        (le, max(0.0, a - b)) for (le, a), (_, b) in zip(after.buckets, before.buckets, strict=True)
    )
    return Histogram(buckets, max(0.0, after.sum - before.sum))


def histogram_quantile(q: float, hist: Histogram) -> float:
    """The q-quantile (0 <= q <= 1) in the histogram's unit, as PromQL's histogram_quantile.

    Linear interpolation inside the bucket holding rank q·count; the first bucket starts at 0 (when
    its bound is positive); a rank in the +Inf bucket gives the highest finite bound. NaN without
    observations, or without a +Inf bucket and one more.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = list(hist.buckets)
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return math.nan
    running = 0.0  # scrapes taken mid-update can be slightly non-monotonic: make them monotonic
    buckets = [(le, running := max(running, c)) for le, c in buckets]
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    # the first finite bucket whose cumulative count reaches the rank, else the +Inf one
    b = next((i for i in range(len(buckets) - 1) if buckets[i][1] >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    if count == 0:  # q = 0 on an empty first bucket (PromQL gives NaN there)
        return start
    return start + (end - start) * (rank / count)


def quantiles(hist: Histogram, qs: Sequence[float] = QUANTILES) -> dict[float, float]:
    return {q: histogram_quantile(q, hist) for q in qs}


def bucket_index(bounds: Sequence[float], value: float) -> int:
    """The bucket (lower, upper] that holds `value`: the first bound >= value."""
    for i, le in enumerate(bounds):
        if value <= le:
            return i
    return len(bounds) - 1


@dataclass(frozen=True)
class Agreement:
    quantile: float
    prometheus_s: float
    locust_s: float
    prometheus_bucket: tuple[float, float]  # (lower, upper] bounds, seconds
    locust_bucket: tuple[float, float]
    agree: bool  # the same bucket or a neighbouring one


def bucket_range(bounds: Sequence[float], index: int) -> tuple[float, float]:
    return (0.0 if index == 0 else bounds[index - 1], bounds[index])


def compare(hist: Histogram, locust_ms: Mapping[float, float]) -> list[Agreement]:
    """Each of locust's quantiles (milliseconds) against the histogram's estimate of the same one.

    They agree when their buckets are the same or adjacent: the histogram cannot resolve less.
    A quantile the histogram cannot estimate (no observations) does not agree.
    """
    bounds = hist.bounds
    out = []
    for q, ms in sorted(locust_ms.items()):
        estimate = histogram_quantile(q, hist)
        seconds = ms / 1000.0
        if math.isnan(estimate) or math.isnan(seconds):
            out.append(Agreement(q, estimate, seconds, (math.nan,) * 2, (math.nan,) * 2, False))
            continue
        i, j = bucket_index(bounds, estimate), bucket_index(bounds, seconds)
        out.append(
            Agreement(
                q,
                estimate,
                seconds,
                bucket_range(bounds, i),
                bucket_range(bounds, j),
                abs(i - j) <= 1,
            )
        )
    return out


def format_comparison(agreements: Sequence[Agreement]) -> str:
    """'p50 87 vs 81 ms ok, p99 540 vs 480 ms ok' (locust vs prometheus)."""
    parts = []
    for a in agreements:
        verdict = "ok" if a.agree else "DIFFERENT BUCKETS"
        parts.append(
            f"p{a.quantile * 100:g} {a.locust_s * 1000:.0f} vs {a.prometheus_s * 1000:.0f} ms {verdict}"
        )
    return ", ".join(parts)
