"""What the collector's OpenTelemetry export (collector/otlp.py) costs per packet.

    .venv/bin/python bench/otlp_cost.py [--packets N] [--hops H] [--rounds R]

Joins N packets of an H-hop trace (10 k packets/s of master time) through the real pipeline, synthetic
records of two nodes, and sends what the export picks to Jaeger v2 of `make jaeger` over OTLP/gRPC:
* every packet an exemplar (--exemplar-every 1) with `--otlp-sample all`: every packet a trace of H spans
  (a root and a span per segment), against the same pipeline without the export;
* the defaults (the 3 slowest per window, 1 in 1000 by ID) with `--otlp-sample slowest`.
Each run is the collector process's CPU time (every thread: the pipeline, the export worker, the SDK's
processor and gRPC) until everything is exported, best of R rounds; the export's cost per packet is the
difference to the run without it. Also the pipeline thread's own time in `OtlpExporter.export` (filter
and queue; with `all` it includes waits for the GIL the worker holds), and what was dropped (none: the
export's queue holds the whole burst here, and the worker waits for the SDK's queue).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from hoptrace.collector.aggregate import AggregateConfig
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.otlp import OtlpConfig, OtlpExporter, beside
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.records import RECORD_SIZE, decode_batch, pack_records
from hoptrace.lab.otel import start_jaeger
from hoptrace.v1 import records_pb2

SEC = 1_000_000_000
BASE = 1_700_000_000 * SEC


class Discard:
    """The InfluxDB exporter's place: takes the points, keeps nothing."""

    def export(self, points: list[Any]) -> None:
        pass


class Timed:
    """Wraps an exporter, summing the time its `export` takes on the caller's (the pipeline's) thread."""

    def __init__(self, inner: OtlpExporter) -> None:
        self.inner = inner
        self.seconds = 0.0

    def export(self, points: list[Any]) -> None:
        t = time.perf_counter()
        self.inner.export(points)
        self.seconds += time.perf_counter() - t


def batches(packets: int, hops: int, chunk: int = 512) -> list[records_pb2.RecordBatch]:
    """Each node's records in batches of `chunk` packets: hops 0..H/2-1 on node a, the rest on node b; a
    packet every 100 us (10 k packets/s), 2-9 us per hop."""
    out = []
    for start in range(0, packets, chunk):
        per_node: dict[str, list] = {"a": [], "b": []}
        for seq in range(start, min(start + chunk, packets)):
            t = BASE + seq * 100_000
            for hop in range(hops):
                t += 2_000 + (seq * 7919 + hop * 104729) % 7_000
                per_node["a" if hop < hops // 2 else "b"].append(
                    (t, (7 << 24) | (seq + 1), 1, 3, 100, hop, 1, 0, 0)
                )
        for node, recs in per_node.items():
            msg = records_pb2.RecordBatch(
                node=node, trace="bench", records=pack_records(recs), record_size=RECORD_SIZE
            )
            msg.clock.monotonic_to_realtime_ns = 0
            out.append(msg)
    return out


def run(packets: int, hops: int, every: int, sample: str | None, endpoint: str) -> dict[str, Any]:
    """One run (`every`: --exemplar-every; `sample`: --otlp-sample, None: no export): process CPU seconds
    until everything is exported, the pipeline thread's share, what was sent and dropped."""
    catalog = TraceCatalog()
    catalog.set_trace(
        "bench", [f"h{i}" for i in range(hops)], ["a" if i < hops // 2 else "b" for i in range(hops)]
    )
    aggregate = AggregateConfig(exemplar_slowest=3, exemplar_every=every)
    work = [decode_batch(b) for b in batches(packets, hops)]
    otlp = timed = None
    if sample is not None:
        # the burst of a bench (every record at once) waits whole: the cost of each packet, none dropped
        config = OtlpConfig(endpoint=endpoint, insecure=True, sample=sample, max_packets=packets)
        config.validate(aggregate.exemplar_every, aggregate.exemplar_slowest)
        otlp = OtlpExporter(
            config, catalog, interval_ns=aggregate.interval_ns, exemplar_every=aggregate.exemplar_every
        )
        timed = Timed(otlp)
    pipeline = CollectorPipeline(beside(Discard(), timed), catalog, aggregate_config=aggregate)
    gc.collect()
    cpu = time.process_time()
    for batch in work:
        pipeline.consume(batch)
    pipeline.flush()
    result: dict[str, Any] = {"packets": pipeline.joiner.stats.complete}
    if otlp is not None:
        assert otlp.flush(120), "the export did not finish in 120 s"
        result["cpu_s"] = time.process_time() - cpu
        result["pipeline_thread_s"] = timed.seconds if timed else 0.0
        result["traces"] = otlp.exported("traces")
        result["histogram_points"] = otlp.exported("metrics")
        result["dropped"] = sum(otlp.dropped.values())
        otlp.close()
    else:
        result["cpu_s"] = time.process_time() - cpu
    return result


def main() -> None:
    """Run the benchmark and print its results."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=20_000)
    ap.add_argument("--hops", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    # (label, --exemplar-every, --otlp-sample): each export against the pipeline alone with its exemplars
    cases = [
        ("every packet an exemplar, no export", 1, None),
        ("every packet an exemplar, --otlp-sample all", 1, "all"),
        ("the default exemplars, no export", 1000, None),
        ("the default exemplars, --otlp-sample slowest", 1000, "slowest"),
    ]
    jaeger = start_jaeger()
    try:
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.rounds):
            for label, every, sample in cases:
                r = run(args.packets, args.hops, every, sample, jaeger.otlp_endpoint)
                if label not in best or r["cpu_s"] < best[label]["cpu_s"]:
                    best[label] = r
    finally:
        jaeger.stop()
    spans = args.hops  # a root and one per segment
    print(
        f"{args.packets} packets of {args.hops} hops; collector CPU until all is sent, best of {args.rounds}"
    )
    for (label, _, sample), (base_label, _, _) in zip(
        cases, [cases[0], cases[0], cases[2], cases[2]], strict=True
    ):
        r = best[label]
        n = r["packets"]
        line = f"  {label}: {r['cpu_s']:.2f} s, {r['cpu_s'] / n * 1e6:.1f} us per packet"
        if sample is not None:
            extra = (r["cpu_s"] - best[base_label]["cpu_s"]) / n * 1e6
            line += (
                f", export +{extra:.1f} us per packet"
                + (f" (+{extra / spans:.1f} us per span)" if sample == "all" else "")
                + f", {r['pipeline_thread_s'] / n * 1e6:.2f} us of it on the pipeline's thread;"
                f" {r['traces']} traces, {r['histogram_points']} histogram points, {r['dropped']} dropped"
            )
        print(line)


if __name__ == "__main__":
    main()
