"""Records/s through Kafka per collector and per partition, side by side in one run (docs/benchmarks.md,
"Design note: 1,000 nodes"; docs/operations.md, "Kafka").

A real broker (lab/kafka.py) and InfluxDB; for each COLLECTORS:PARTITIONS case the collectors (`hoptrace
collector --kafka-brokers ...` at default settings: sketches and exemplars, separate processes) start on a
fresh topic and settle as a group (every partition owned, none idle), then a backlog of a 2-hop, 2-node trace
is published as agents would publish it (each node's 1,024-record batches split by partition, a heartbeat
per partition after each). Measured from the start of publishing (the collectors consume meanwhile): until
the last packet is joined (records/s joined) and until every message is committed, i.e. its points are in
InfluxDB (records/s done); and the CPU seconds each collector, the broker and influxd used meanwhile
(/proc/PID/stat), so records per collector CPU-second does not depend on what else ran on the shared cores.
Everything shares this machine's cores: compare the cases of one run.

    .venv/bin/python bench/kafka_collectors.py --packets 200000 --cases 1:1 1:4 2:4 2:8 1:1 1:4 2:4 2:8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hoptrace.lab.kafka import publish_backlog, start_kafka
from hoptrace.lab.lifecycle import dies_with_parent
from hoptrace.lab.processes import free_port, start_influxd
from hoptrace.lab.prometheus import scrape

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (its threads included; /proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run(
    collectors: int, packets: int, partitions: int, broker, influx, workdir: Path, batch: int = 1024
) -> dict:
    trace = f"bench-kafka-{collectors}-{partitions}-{time.time_ns()}"
    topic = f"bench-{collectors}-{time.time_ns()}"
    broker.create_topic(topic, partitions)
    traces = workdir / f"{trace}.json"
    traces.write_text(
        json.dumps(
            {"name": trace, "hops": [{"name": "a", "node": "node-a"}, {"name": "b", "node": "node-b"}]}
        )
    )
    procs, addrs = [], []
    for n in range(collectors):
        addr = f"127.0.0.1:{free_port()}"
        argv = [
            sys.executable,
            "-m",
            "hoptrace.cli.main",
            "collector",
            "--insecure",
            "--log-level",
            "WARNING",
            "--kafka-brokers",
            broker.bootstrap,
            "--kafka-topic",
            topic,
            "--kafka-group",
            f"g-{topic}",
            "--traces",
            str(traces),
            "--influx-url",
            influx.url,
            "--influx-bucket",
            influx.bucket,
            "--clock-listen",
            "",
            "--metrics-listen",
            addr,
            "--spool-dir",
            str(workdir / f"spool-{topic}-{n}"),
        ]
        log = open(workdir / f"collector-{topic}-{n}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(dies_with_parent(argv), stdout=log, stderr=subprocess.STDOUT))
        addrs.append(addr)

    def total(name: str) -> float:
        s = 0.0
        for a in addrs:
            with contextlib.suppress(OSError):
                s += scrape(a).get(name, 0.0)
        return s

    # The group settles first (every partition owned, no collector without one), then the backlog arrives:
    # the steady state of a deployment. A group still rebalancing while a backlog drains is not what is
    # measured here (see docs/benchmarks.md on what it did).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        owned_now = []
        for a in addrs:
            with contextlib.suppress(OSError):
                owned_now.append(scrape(a).get("hoptrace_collector_kafka_partitions_assigned", 0))
        if len(owned_now) == collectors and sum(owned_now) == partitions and min(owned_now) >= 1:
            break
        time.sleep(0.2)
    else:
        raise RuntimeError(f"the group did not settle: partitions owned {owned_now}")
    time.sleep(2)  # no rebalance in flight

    others = {"broker": broker.process.pid, "influxd": influx.process.pid}
    cpu_at_first = {name: cpu_seconds(pid) for name, pid in others.items()}
    collectors_cpu_at_first = [cpu_seconds(p.pid) for p in procs]
    first = published = time.monotonic()  # the collectors consume while it is published
    records = publish_backlog(broker.bootstrap, topic, trace, packets, partitions, batch)
    publish_s = time.monotonic() - published
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if total("hoptrace_collector_packets_emitted_total") >= packets:
            break
        time.sleep(0.1)
    joined = time.monotonic()
    # Done: every consumed message committed, i.e. the points of its packets accepted by InfluxDB.
    while time.monotonic() < deadline and total("hoptrace_collector_kafka_uncommitted_messages") > 0:
        time.sleep(0.1)
    done = time.monotonic()
    cpu = {name: round(cpu_seconds(pid) - cpu_at_first[name], 2) for name, pid in others.items()}
    collectors_cpu = [
        round(cpu_seconds(p.pid) - c0, 2) for p, c0 in zip(procs, collectors_cpu_at_first, strict=True)
    ]
    per = [scrape(a) for a in addrs]
    owned = [m.get("hoptrace_collector_kafka_partitions_assigned", 0) for m in per]
    received = [
        sum(v for k, v in m.items() if k.startswith("hoptrace_collector_records_received_total")) for m in per
    ]
    points = sum(m.get("hoptrace_collector_points_written_total", 0) for m in per)
    emitted = sum(m.get("hoptrace_collector_packets_emitted_total", 0) for m in per)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)
    joined_rate = records / (joined - first)
    return {
        "collectors": collectors,
        "partitions": partitions,
        "batch": batch,
        "messages_consumed": sum(m.get("hoptrace_collector_kafka_messages_total", 0) for m in per),
        "packets": packets,
        "records": records,
        "partitions_owned": owned,
        "records_received": received,
        "packets_emitted": emitted,
        "points_written": points,
        "join_s": round(joined - first, 2),
        "records_per_s_joined": round(joined_rate),
        "records_per_s_done": round(records / (done - first)),
        "records_per_s_per_partition": round(joined_rate / partitions),
        "collector_cpu_s": collectors_cpu,
        "records_per_collector_cpu_s": round(records / sum(collectors_cpu)),
        "publish_s": round(publish_s, 2),
        "broker_cpu_s": cpu["broker"],
        "influxd_cpu_s": cpu["influxd"],
        # the broker's CPU for taking the records in and serving them to the group
        "records_per_broker_cpu_s": round(records / max(cpu["broker"], 0.01)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=300_000)
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["1:1", "1:4", "2:4"],
        metavar="COLLECTORS:PARTITIONS[:BATCH]",
        help="collectors in the group, partitions of the topic and packets per agent batch (1024), one case "
        "each, in this order",
    )
    args = parser.parse_args()
    cases = [tuple(int(n) for n in case.split(":")) for case in args.cases]
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-bench-kafka-"))
    broker = start_kafka()
    influx = start_influxd()
    try:
        for collectors, partitions, *batch in cases:
            result = run(collectors, args.packets, partitions, broker, influx, workdir, *batch)
            print(json.dumps(result), flush=True)
    finally:
        broker.stop()
        influx.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
