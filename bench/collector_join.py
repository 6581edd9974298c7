"""Throughput and memory of the collector's join stage (`HopJoiner.join_hops`).

    .venv/bin/python bench/collector_join.py [--packets N] [--hops H] [--batch B]

Reports hop records joined per second on one core (decode + join, records shuffled within each node's batches
as agents deliver them), and the memory one pending packet holds (for the bound stated in join.py).
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.join import HopJoiner, JoinConfig
from hoptrace.collector.records import decode_records, pack_records


def main() -> None:
    """Run the benchmark and print its results."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--packets", type=int, default=500_000)
    ap.add_argument("--hops", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1024)
    args = ap.parse_args()
    catalog = TraceCatalog()
    catalog.set_trace("bench", [f"h{i}" for i in range(args.hops)], ["n"] * args.hops)
    # one batch per hop per chunk of packets: hop records of a packet arrive in different batches
    chunk = max(1, args.batch)
    payloads = []
    for start in range(0, args.packets, chunk):
        for hop in range(args.hops):
            recs = [
                (
                    1_000_000 + i * 1_000 + hop * 100,
                    (1 << 24) | (i & 0xFFFFFF),
                    i * 2654435761 & 0xFFFFFFFF,
                    1,
                    100,
                    hop,
                    1,
                    0,
                    0,
                )
                for i in range(start, min(start + chunk, args.packets))
            ]
            payloads.append(pack_records(recs))
    joiner = HopJoiner(catalog, JoinConfig(max_entries=10_000_000))
    gc.collect()
    t0 = time.perf_counter()
    emitted = 0
    for data in payloads:
        emitted += len(joiner.join_hops("bench", "n", decode_records(data)))
    dt = time.perf_counter() - t0
    n = args.packets * args.hops
    print(f"{n} records, {emitted} packets in {dt:.3f} s: {n / dt / 1e3:.0f} k records/s joined (1 core)")

    # memory of pending packets: every hop but the last
    joiner = HopJoiner(catalog, JoinConfig(max_entries=10_000_000))
    pending = min(args.packets, 200_000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for hop in range(args.hops - 1):
        recs = [
            (10**18 + i * 1_000 + hop, (1 << 24) | i, i * 2654435761 & 0xFFFFFFFF, 1, 100, hop, 1, 0, 0)
            for i in range(pending)
        ]
        joiner.join_hops("bench", "n", recs)
        del recs
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(
        f"{joiner.pending()} pending packets of {args.hops} hops ({args.hops - 1} seen): "
        f"{used / joiner.pending():.0f} bytes each"
    )


if __name__ == "__main__":
    main()
