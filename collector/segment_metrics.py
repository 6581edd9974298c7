"""Segment metrics users alert on, for Prometheus (`/metrics`, beside the collector's own counters).

Per trace and segment (end to end included, as `segment="end_to_end"`):
- `hoptrace_segment_latency_seconds` (histogram): every joined packet's latency in the segment, observed
  when its 1 s window closes;
- `hoptrace_segment_lost_packets_total` (counter): network loss (the tracer's own losses excluded);
- `hoptrace_segment_dropped_packets_total` (counter, also labelled `node`, `reason` and `function`): a trace
  with `drops: true`: the lost packets that node's kernel dropped for that reason (enum skb_drop_reason's
  name, e.g. `NETFILTER_DROP`) in that kernel function (e.g. `nft_do_chain`; `unknown` where the node's
  agent could not read kallsyms), per segment they were lost in;
- `hoptrace_segment_jitter_seconds` (gauge): mean jitter of the last closed 1 s window;
- `hoptrace_segment_below_clock_bound` (gauge, 0/1): the last window's median was within the clocks' bound,
  so its sign and size across the two nodes are not meaningful.

Cardinality is bounded: at most `max_series` (trace, segment) pairs; beyond, new pairs are counted in
`hoptrace_segment_series_dropped_total` instead of getting series. Series of a trace the catalog no longer
has are removed.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hoptrace.collector.aggregate import SegmentWindow

disable_created_metrics()  # no *_created series: they double the lines and nobody alerts on them

# 1 us .. 1 s in 1-2-5 steps: a veth hop is a few us, a congested queue or a VM exit ms.
LATENCY_BUCKETS = tuple(m * 10.0**e for e in range(-6, 0) for m in (1, 2, 5)) + (1.0,)
LABELS = ("trace", "segment")
DROP_LABELS = (*LABELS, "node", "reason", "function")


class LatencyHistograms(Collector):
    """`hoptrace_segment_latency_seconds`, a window's sorted latencies added at once: one bisection per
    bucket instead of a `Histogram.observe` per packet (a tenth of the Kafka collector's profile). A
    bucket counts the latencies <= its bound, as `observe` does."""

    NAME = "hoptrace_segment_latency_seconds"
    HELP = "Latency of each traced packet in a segment of its path."

    def __init__(self) -> None:
        # per (trace, segment): the cumulative count of each bucket, then the sum (s) and the count
        self._series: dict[tuple[str, str], list[Any]] = {}

    def add_sorted(self, labels: tuple[str, str], latencies_ns: list[int]) -> None:
        series = self._series.setdefault(labels, [[0] * len(LATENCY_BUCKETS), 0.0, 0])
        counts = series[0]
        for i, le in enumerate(LATENCY_BUCKETS):
            counts[i] += bisect.bisect_right(latencies_ns, le, key=_seconds)
        series[1] += sum(latencies_ns) / 1e9
        series[2] += len(latencies_ns)

    def remove(self, trace: str, segment: str) -> None:
        self._series.pop((trace, segment), None)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.NAME, self.HELP, labels=LABELS)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.NAME, self.HELP, labels=LABELS)
        for labels, (counts, total, n) in list(self._series.items()):
            buckets = [(floatToGoString(le), c) for le, c in zip(LATENCY_BUCKETS, counts, strict=True)]
            family.add_metric(list(labels), [*buckets, ("+Inf", n)], total)
        yield family


def _seconds(latency_ns: int) -> float:
    return latency_ns / 1e9


class SegmentMetrics:
    """Observes the pipeline's samples and closed windows; renders them in the exposition format."""

    def __init__(self, max_series: int = 2_000) -> None:
        self.max_series = max_series
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._series: set[tuple[str, str]] = set()
        self.latency = LatencyHistograms()
        self.registry.register(self.latency)
        self.lost = Counter(
            "hoptrace_segment_lost_packets",
            "Packets seen at a segment's first hop and never at its second (network loss).",
            LABELS,
            registry=self.registry,
        )
        self.drops = Counter(
            "hoptrace_segment_dropped_packets",
            "Lost packets of a segment that a node's kernel dropped, by node, drop reason and the kernel"
            " function that freed them (drops: true).",
            DROP_LABELS,
            registry=self.registry,
        )
        self._drop_series: set[tuple[str, str, str, str, str]] = set()
        self.jitter = Gauge(
            "hoptrace_segment_jitter_seconds",
            "Mean jitter of the segment's latency over the last closed 1 s window.",
            LABELS,
            registry=self.registry,
        )
        self.below_bound = Gauge(
            "hoptrace_segment_below_clock_bound",
            "1 when the last window's median latency was within the clocks' alignment bound.",
            LABELS,
            registry=self.registry,
        )
        self.dropped = Counter(
            "hoptrace_segment_series_dropped",
            "Samples of (trace, segment) pairs beyond max_series: not given series.",
            registry=self.registry,
        )

    def _admit(self, trace: str, segment: str) -> bool:
        key = (trace, segment)
        if key in self._series:
            return True
        if len(self._series) >= self.max_series:
            self.dropped.inc()
            return False
        self._series.add(key)
        return True

    def observe(self, windows: Iterable[SegmentWindow]) -> None:
        """Account closed windows: their packets' latencies, loss, jitter."""
        with self._lock:
            for window in windows:
                if not self._admit(window.trace, window.segment):
                    continue
                labels = (window.trace, window.segment)
                self.latency.add_sorted(labels, window.values)
                self.lost.labels(*labels).inc(window.loss_count)
                for (node, reason, function), count in window.drops.items():
                    self.drops.labels(*labels, node, reason, function).inc(count)
                    self._drop_series.add((*labels, node, reason, function))
                self.jitter.labels(*labels).set(window.jitter_ns / 1e9)
                self.below_bound.labels(*labels).set(1 if window.below_clock_bound else 0)

    def forget_traces(self, live: set[str]) -> None:
        """Remove the series of traces not in `live` (deleted ones)."""
        with self._lock:
            for trace, segment in [key for key in self._series if key[0] not in live]:
                for metric in (self.latency, self.lost, self.jitter, self.below_bound):
                    with contextlib.suppress(KeyError):  # a pair that had only samples, or only windows
                        metric.remove(trace, segment)
                self._series.discard((trace, segment))
            for key in [key for key in self._drop_series if key[0] not in live]:
                self.drops.remove(*key)
                self._drop_series.discard(key)

    def render(self) -> str:
        """The exposition text of every segment metric."""
        return generate_latest(self.registry).decode()
