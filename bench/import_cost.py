"""What `hoptrace import` costs per record: an agent's JSON lines read back, against the live stream.

    .venv/bin/python bench/import_cost.py [--packets N] [--hops H] [--rounds R]

Writes two nodes' files of an H-hop trace (hops 0..H/2-1 on node a, the rest on node b; N packets, 10 k
packets/s of master time, a heartbeat's counters lines every second) as the agent writes them with `--out`
(agent/internal/output), then times, best of R rounds, on one core:
* `scan`: reading and checking every line and the files together (`scan_files`, `check_files`);
* `import`: the files' batches through the collector's pipeline, InfluxDB's place taken by an exporter that
  keeps nothing (`feed_pipeline`);
* `live`: the same records as the collector's gRPC stream gives them (decoded batches) through the same
  pipeline: what a record costs there anyway.
The import's own cost per record is `scan` plus `import` minus `live`.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from hoptrace.collector.file_input import catalog_of, check_files, feed_pipeline, scan_files
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.records import DecodedBatch

SEC = 1_000_000_000
MONO_TO_REAL = 1_700_000_000 * SEC
TRACE = "bench-import"
BATCH = 512  # records per batch of the live stream


class Discard:
    """InfluxDB's place: takes the points, keeps nothing."""

    def export(self, points: list[Any]) -> None:
        pass


def node_records(packets: int, hops: range) -> list[tuple[int, ...]]:
    """Record tuples (RECORD_FIELDS order) of one node's hops: a packet every 100 us, 3 us per hop."""
    out = []
    for i in range(packets):
        for hop in hops:
            ts = SEC + i * 100_000 + hop * 3_000
            out.append((ts, (1 << 24) | (i + 1), 0xABCD, 3, 128, hop, 1, 0, 4))
    return out


def write_file(path: Path, node: str, hops: range, names: list[str], packets: int) -> int:
    """The node's --out file: trace and clock lines, its record lines, a counters line per hop each second."""
    lines: list[dict[str, Any]] = [
        {
            "type": "trace",
            "trace": TRACE,
            "generation": 1,
            "node": node,
            "hops": [{"hop_index": h, "name": names[h]} for h in hops],
        },
        {"type": "clock", "node": node, "monotonic_to_realtime_ns": MONO_TO_REAL},
    ]
    records = node_records(packets, hops)
    next_heartbeat = SEC
    for ts, pid, flow, ifindex, wire_len, hop, _slot, cpu, flags in records:
        if ts >= next_heartbeat:
            for h in hops:
                lines.append(
                    {
                        "type": "counters",
                        "trace": TRACE,
                        "generation": 1,
                        "hop": names[h],
                        "hop_index": h,
                        "at": time.strftime(
                            "%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime((MONO_TO_REAL + ts) / SEC)
                        ),
                        "watermark_ns": ts,
                    }
                )
            next_heartbeat += SEC
        lines.append(
            {
                "type": "record",
                "trace": TRACE,
                "hop": names[hop],
                "hop_index": hop,
                "packet_id": pid,
                "flow_hash": flow,
                "ts_ns": ts,
                "ifindex": ifindex,
                "wire_len": wire_len,
                "cpu": cpu,
                "flags": flags,
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(records)


def main() -> None:
    """Run the benchmark and print its results."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--packets", type=int, default=50_000)
    ap.add_argument("--hops", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    names = [f"h{i}" for i in range(args.hops)]
    half = args.hops // 2
    with tempfile.TemporaryDirectory(prefix="hoptrace-bench-import-") as tmp:
        paths = [Path(tmp) / "host-a.jsonl", Path(tmp) / "host-b.jsonl"]
        records = write_file(paths[0], "host-a", range(half), names, args.packets)
        records += write_file(paths[1], "host-b", range(half, args.hops), names, args.packets)
        size = sum(p.stat().st_size for p in paths)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            gc.collect()
            t = time.perf_counter()
            files = scan_files(paths)
            imported = check_files(files)
            best["scan"] = min(best.get("scan", float("inf")), time.perf_counter() - t)
            catalog = catalog_of(imported)
            live: list[DecodedBatch] = []
            for _, batch in sorted(
                ((key, batch) for f in files for key, batch in f.batches()), key=lambda kb: kb[0]
            ):
                for start in range(0, max(len(batch.records), 1), BATCH):
                    live.append(
                        DecodedBatch(
                            batch.node,
                            batch.trace,
                            batch.generation,
                            batch.batch_seq,
                            batch.records[start : start + BATCH],
                            batch.counters if start == 0 else [],
                            batch.clock,
                            watermark_ns=batch.watermark_ns,
                        )
                    )
            imported_pipeline = CollectorPipeline(Discard(), catalog)
            gc.collect()
            t = time.perf_counter()
            feed_pipeline(files, imported_pipeline)
            best["import"] = min(best.get("import", float("inf")), time.perf_counter() - t)
            pipeline = CollectorPipeline(Discard(), catalog_of(imported))
            gc.collect()
            t = time.perf_counter()
            for batch in live:
                pipeline.consume(batch)
            pipeline.flush()
            best["live"] = min(best.get("live", float("inf")), time.perf_counter() - t)
            complete = (imported_pipeline.stats()["complete"], pipeline.stats()["complete"])
            if complete != (args.packets, args.packets):  # both joined every packet, or the numbers lie
                raise SystemExit(f"complete packets (import, live) {complete}, want {args.packets} each")
    per = {name: seconds / records * 1e6 for name, seconds in best.items()}
    own = per["scan"] + per["import"] - per["live"]
    print(
        f"{records} records ({args.packets} packets x {args.hops} hops, {size / records:.0f} bytes a line): "
        + ", ".join(f"{name} {us:.2f} us" for name, us in per.items())
        + f" a record; the import's own {own:.2f} us a record ({1 / own:.2f} M records/s)"
    )


if __name__ == "__main__":
    main()
