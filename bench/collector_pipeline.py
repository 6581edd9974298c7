"""Throughput of the collector's decode -> join -> aggregate path on one core, now and at a baseline commit,
side by side in one run.

    .venv/bin/python bench/collector_pipeline.py [--baseline REV] [--packets N] [--hops H] [--rounds R]

The same synthetic batches (one per hop per chunk of packets, as agents deliver them; per-hop latencies
drawn from a lognormal, so windows hold realistic sketches) go through `decode_records`,
`HopJoiner.join_hops`, `SegmentAggregator.add_packets` and `close_windows` (then `flush`): everything the
collector does to a record before export, without gRPC and InfluxDB. The baseline is the collector, common
and generated packages of `REV` (`git archive`), imported from a temporary directory in a subprocess;
rounds alternate between the two, and each reports the median of its rounds. Records/s per core = records
/ CPU time of the process over the whole path (the machine may be shared: wall time is printed beside it).
Nothing is asserted; it prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEC = 1_000_000_000


def batches(packets: int, hops: int, chunk: int = 1024) -> list[bytes]:
    """Packed record batches: one per hop per `chunk` packets, 20 µs apart, lognormal hop latencies."""
    from hoptrace.collector.records import pack_records

    rng = random.Random(14)
    base = 10**18
    times = []
    for i in range(packets):
        t = base + i * 20_000
        row = [t]
        for _ in range(hops - 1):
            t += max(1, round(rng.lognormvariate(math.log(3_000), 0.7)))
            row.append(t)
        times.append(row)
    out = []
    for start in range(0, packets, chunk):
        for hop in range(hops):
            out.append(
                pack_records(
                    (
                        times[i][hop],
                        (1 << 24) | (i & 0xFFFFFF),
                        i * 2654435761 & 0xFFFFFFFF,
                        1,
                        100,
                        hop,
                        1,
                        0,
                        0,
                    )
                    for i in range(start, min(start + chunk, packets))
                )
            )
    return out


def worker(packets: int, hops: int) -> dict[str, object]:
    """One timed pass through decode -> join -> aggregate of the code importable as `hoptrace`."""
    import gc

    import hoptrace.collector.aggregate as aggregate
    from hoptrace.collector.catalog import TraceCatalog
    from hoptrace.collector.join import HopJoiner, JoinConfig
    from hoptrace.collector.records import decode_records

    catalog = TraceCatalog()
    catalog.set_trace("bench", [f"h{i}" for i in range(hops)], ["n"] * hops)
    payloads = batches(packets, hops)
    joiner = HopJoiner(catalog, JoinConfig(max_entries=10_000_000))
    segments = aggregate.SegmentAggregator(catalog)
    gc.collect()
    windows = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for data in payloads:
        segments.add_packets(joiner.join_hops("bench", "n", decode_records(data)))
        windows += len(segments.close_windows(joiner.watermark_ns - 2 * SEC))
    windows += len(segments.flush())
    dt = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return {
        "records_per_s": packets * hops / cpu,
        "wall_records_per_s": packets * hops / dt,
        "cpu_seconds": cpu,
        "seconds": dt,
        "windows": windows,
        "complete": joiner.stats.complete,
        "code": aggregate.__file__,
    }


def baseline_tree(rev: str, into: Path) -> Path:
    """`hoptrace` as of `rev` (generated packages, collector, common) laid out as a package under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "proto/gen/python/hoptrace", "collector", "common"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into / "src", filter="data")
    package = into / "hoptrace"
    (into / "src" / "proto" / "gen" / "python" / "hoptrace").rename(package)
    (into / "src" / "collector").rename(package / "collector")
    (into / "src" / "common").rename(package / "common")
    return into


def run_worker(packets: int, hops: int, pythonpath: Path | None) -> dict[str, object]:
    """The worker in a fresh interpreter (the baseline's `hoptrace` first on the path when given)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--packets", str(packets), "--hops", str(hops)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=900,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    """Parse flags; run the worker (`--worker`) or the comparison."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--baseline", default="8428678", help="git revision to compare with (default: before the sketches)"
    )
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--hops", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.packets, args.hops)))
        return
    results: dict[str, list[dict[str, object]]] = {"baseline": [], "now": []}
    with tempfile.TemporaryDirectory(prefix="hoptrace-bench-baseline-") as tmp:
        base = baseline_tree(args.baseline, Path(tmp))
        for r in range(args.rounds):
            order = [("baseline", base), ("now", None)]
            for name, path in order if r % 2 == 0 else order[::-1]:
                results[name].append(run_worker(args.packets, args.hops, path))
    assert str(results["baseline"][0]["code"]).startswith(tmp), results["baseline"][0]["code"]
    med = {name: statistics.median(float(r["records_per_s"]) for r in rows) for name, rows in results.items()}
    records = args.packets * args.hops
    print(
        f"decode -> join -> aggregate, {args.packets} packets x {args.hops} hops = {records} records, 1 core"
    )
    print(f"{'code':<18} {'records/s per core (median)':>28} {'rounds':>28} {'wall rounds':>28}")
    for name, label in (("baseline", f"baseline {args.baseline}"), ("now", "now")):
        rounds = ", ".join(f"{float(r['records_per_s']) / 1e3:.0f} k" for r in results[name])
        wall = ", ".join(f"{float(r['wall_records_per_s']) / 1e3:.0f} k" for r in results[name])
        print(f"{label:<18} {med[name] / 1e3:>26.0f} k {rounds:>28} {wall:>28}")
    print(f"ratio now / baseline: {med['now'] / med['baseline']:.2f}x")
    print(json.dumps({"baseline": args.baseline, "median_records_per_s": med, "rounds": results}))


if __name__ == "__main__":
    main()
