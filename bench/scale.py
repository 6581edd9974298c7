"""Scale: 1, 4, 16, 32 agents feeding one collector.

The agents are synthetic (the simplest way to have 32 of them on 2 cores): sender processes (this file with
`--send`) open one `Collector/StreamRecords` stream per emulated node and send RecordBatches at a fixed record
rate per node, exactly what an agent sends (32-byte records, `batch_seq`, `NodeClock`). Each node has its own
two-hop trace (from `--traces`), so every packet is joined and aggregated into the per-second windows and
sketches written to a real influxd (per-packet `hop_latency` points only for the exemplars).
Measured over each step: records offered, records the collector received, packets it emitted, points InfluxDB
took, and the collector's CPU (1.0 = one core) and peak RSS. The senders share the 2 cores with the collector.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RECORDS_PER_BATCH = 1024  # what the agent batches (agent/internal/stream: DefaultBatchRecords)


def send(addr: str, nodes: list[str], rate: float, seconds: float) -> dict[str, int]:
    """Stream batches for every node in `nodes` at `rate` records/s each for `seconds`; records sent."""
    import grpc

    from hoptrace.collector.records import pack_records
    from hoptrace.v1 import records_pb2, records_pb2_grpc

    sent = dict.fromkeys(nodes, 0)
    channel = grpc.insecure_channel(addr)
    stub = records_pb2_grpc.CollectorStub(channel)
    offset = time.time_ns() - time.monotonic_ns()
    end = time.monotonic() + seconds

    def batches(node: str, salt: int) -> Any:
        seq0 = time.time_ns()
        packets = RECORDS_PER_BATCH // 2
        start = time.monotonic()
        n = 0
        while time.monotonic() < end:
            due = start + n * RECORDS_PER_BATCH / rate
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            now = time.monotonic_ns()
            recs = []
            for i in range(packets):
                pid = (salt << 24) | ((n * packets + i) & 0xFFFFFF)
                ts = now - 5_000_000 + i * 1000
                recs.append((ts, pid, 0x1234567, 2, 100, 0, 1, 0, 4))
                recs.append((ts + 5000, pid, 0x1234567, 3, 100, 1, 1, 0, 4))
            yield records_pb2.RecordBatch(
                node=node,
                trace=f"scale-{node}",
                generation=1,
                batch_seq=seq0 + n,
                records=pack_records(recs),
                record_size=32,
                clock=records_pb2.NodeClock(monotonic_to_realtime_ns=offset),
            )
            sent[node] += len(recs)
            n += 1

    threads = [
        threading.Thread(
            target=lambda nd=node, s=k: stub.StreamRecords(batches(nd, s % 255 + 1)), daemon=True
        )
        for k, node in enumerate(nodes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    channel.close()
    return sent


def traces_file(path: Path, agents: int) -> None:
    """The two-hop trace of every emulated node."""
    specs = [
        {"name": f"scale-n{k}", "hops": [{"name": "h0", "node": f"n{k}"}, {"name": "h1", "node": f"n{k}"}]}
        for k in range(agents)
    ]
    path.write_text(json.dumps({"traces": specs}))


def run(ctx: Any) -> dict[str, Any]:
    """Rising agent counts at a fixed rate per agent."""
    from common import UsageSampler, free_port, log, metric_sum, scrape, stop_process, target

    counts = ctx.size([1, 4], [1, 4, 16, 32])
    per_agent = ctx.size(2_000, 4_000)
    seconds = ctx.size(3.0, 10.0)
    influx = ctx.influx()
    traces = ctx.workdir / "scale-traces.json"
    traces_file(traces, max(counts))
    listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    help_text = subprocess.run(
        [sys.executable, "-m", "hoptrace.cli.main", "collector", "--help"], capture_output=True, text=True
    ).stdout
    argv = [
        sys.executable,
        "-m",
        "hoptrace.cli.main",
        "collector",
        "--listen",
        listen,
        "--influx-url",
        influx.url,
        "--traces",
        str(traces),
        "--metrics-listen",
        metrics,
        "--clock-listen",
        "",
        "--join-window",
        "1",
        "--spool-dir",
        str(ctx.workdir / "scale-spool"),
        *(["--insecure"] if "--insecure" in help_text else []),
    ]
    log_path = ctx.workdir / "scale-collector.log"
    steps: list[dict[str, Any]] = []
    with open(log_path, "wb") as logf:
        collector = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(metrics, 1)
                break
            except OSError:
                if collector.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"collector did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.2)
        for agents in counts:
            m0 = scrape(metrics)
            sampler = UsageSampler(collector.pid, 0.2)
            nodes = [f"n{k}" for k in range(agents)]
            groups = [nodes[i::2] for i in range(min(2, agents))]  # two sender processes at most (2 cores)
            senders = [
                subprocess.Popen(
                    [sys.executable, __file__, "--send", listen, ",".join(g), str(per_agent), str(seconds)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for g in groups
            ]
            offered = 0
            for s in senders:
                out, _ = s.communicate(timeout=seconds + 60)
                if s.returncode != 0:
                    raise RuntimeError(f"sender failed ({s.returncode})")
                offered += sum(json.loads(out).values())
            time.sleep(2.0)  # the join window closes, the exporter flushes
            usage = sampler.stop()
            m1 = scrape(metrics)

            def delta(name: str, m0: dict = m0, m1: dict = m1) -> float:
                return metric_sum(m1, f"hoptrace_collector_{name}") - metric_sum(
                    m0, f"hoptrace_collector_{name}"
                )

            received = delta("records_received_total")
            step = {
                "agents": agents,
                "offered_records_per_s": offered / seconds,
                "offered": offered,
                "received": int(received),
                "packets_emitted": int(delta("packets_emitted_total")),
                "points_written": int(delta("points_written_total")),
                "dropped": int(delta("dropped_total")),
                "collector_cpu_cores": usage["cpu_cores"],
                "collector_peak_rss_mb": usage["peak_rss_bytes"] / 2**20,
                "received_ratio": received / offered if offered else None,
            }
            steps.append(step)
            log(
                f"scale {agents} agents: offered {step['offered_records_per_s'] / 1e3:.1f} k rec/s, received "
                f"{step['received_ratio']:.2f}, cpu {step['collector_cpu_cores']:.2f}, "
                f"rss {step['collector_peak_rss_mb']:.0f} MB"
            )
            if collector.poll() is not None:
                raise RuntimeError(f"collector exited: {log_path.read_text()[-2000:]}")
    finally:
        stop_process(collector, timeout_s=30)

    saturated = next(
        (s["agents"] for s in steps if (s["received_ratio"] or 0) < 0.95 or s["collector_cpu_cores"] > 0.9),
        None,
    )
    return {
        "per_agent_records_per_s": per_agent,
        "seconds_per_step": seconds,
        "steps": steps,
        "summary": {
            "saturates_at_agents": saturated,
            "max_received_per_s": max(s["received"] / seconds for s in steps),
        },
        "targets": [
            target(
                "collector keeps up with every step (received/offered, worst)",
                min(s["received_ratio"] or 0 for s in steps),
                0.99,
                "ratio",
                higher_is_better=True,
            )
        ],
        "table": {
            "columns": [
                "agents",
                "offered rec/s",
                "received / offered",
                "packets emitted",
                "points written",
                "collector CPU (cores)",
                "peak RSS MB",
            ],
            "rows": [
                [
                    s["agents"],
                    s["offered_records_per_s"],
                    s["received_ratio"],
                    s["packets_emitted"],
                    s["points_written"],
                    s["collector_cpu_cores"],
                    s["collector_peak_rss_mb"],
                ]
                for s in steps
            ],
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="synthetic agents of the scale benchmark")
    parser.add_argument("--send", nargs=4, metavar=("ADDR", "NODES", "RATE", "SECONDS"), required=True)
    a = parser.parse_args()
    print(json.dumps(send(a.send[0], a.send[1].split(","), float(a.send[2]), float(a.send[3]))))
