"""Records/s through Kafka with 1 and 2 collectors in one group (docs/operations.md, "Kafka").

A real broker (lab/kafka.py) and InfluxDB; a backlog of a 2-hop, 2-node trace is published first, as agents
would publish it (each node's 1,024-record batches split by partition, a heartbeat per partition after each),
then N collectors (`hoptrace collector --kafka-brokers ...`, separate processes) start together and the time
from their first consumed message to the last packet joined is measured: records/s = records / that time.
Everything (broker, InfluxDB, collectors) shares this machine's cores.

    .venv/bin/python bench/kafka_collectors.py --packets 300000 --partitions 4 --collectors 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer

from hoptrace.collector.records import RECORD_SIZE, pack_records
from hoptrace.lab.kafka import start_kafka
from hoptrace.lab.lifecycle import die_with_parent
from hoptrace.lab.processes import free_port, start_influxd
from hoptrace.v1 import records_pb2

HEADER = [("hoptrace-format", b"RecordBatch/v1")]
SEC = 1_000_000_000


def publish_backlog(bootstrap: str, topic: str, trace: str, packets: int, partitions: int) -> int:
    """Publish `packets` packets of a 2-hop trace (node-a hop 0, node-b hop 1); returns the records."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    rate = 5_000  # packets per second of master time
    base = time.time_ns() - (packets // rate + 120) * SEC
    seq = {"node-a": 0, "node-b": 0}
    records = 0

    def send(node: str, recs: list[tuple], watermark: int) -> None:
        seq[node] += 1
        parts: dict[int, list[tuple]] = {}
        for r in recs:
            parts.setdefault(r[1] % partitions, []).append(r)
        clock = records_pb2.NodeClock(monotonic_to_realtime_ns=0)
        for p, part in parts.items():
            msg = records_pb2.RecordBatch(
                node=node,
                trace=trace,
                generation=1,
                batch_seq=seq[node],
                records=pack_records(part),
                record_size=RECORD_SIZE,
                clock=clock,
            )
            producer.produce(topic, msg.SerializeToString(), partition=p, headers=HEADER)
        seq[node] += 1
        for p in range(partitions):
            beat = records_pb2.RecordBatch(
                node=node,
                trace=trace,
                generation=1,
                batch_seq=seq[node],
                record_size=RECORD_SIZE,
                clock=clock,
                watermark_ns=watermark,
            )
            producer.produce(topic, beat.SerializeToString(), partition=p, headers=HEADER)
        producer.poll(0)

    for start in range(0, packets, 1024):
        ids = range(start, min(start + 1024, packets))
        a = [(base + i * SEC // rate, (7 << 24) | i, 0xABCD, 3, 100, 0, 1, 0, 0) for i in ids]
        b = [
            (t + 40_000 + i % 997, pid, fh, 4, 100, 1, 1, 0, 0)
            for (t, pid, fh, *_), i in zip(a, ids, strict=True)
        ]
        send("node-a", a, a[-1][0])
        send("node-b", b, b[-1][0])
        records += len(a) + len(b)
    producer.flush(120)
    # a last heartbeat far ahead: every packet can leave the join
    send("node-a", [], time.time_ns())
    send("node-b", [], time.time_ns())
    producer.flush(120)
    return records


def scrape(addr: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def run(collectors: int, packets: int, partitions: int, broker, influx, workdir: Path) -> dict:
    trace = f"bench-kafka-{collectors}"
    topic = f"bench-{collectors}-{time.time_ns()}"
    broker.create_topic(topic, partitions)
    records = publish_backlog(broker.bootstrap, topic, trace, packets, partitions)
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
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent))
        addrs.append(addr)

    def total(name: str) -> float:
        s = 0.0
        for a in addrs:
            with contextlib.suppress(OSError):
                s += scrape(a).get(name, 0.0)
        return s

    first = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if first is None and total("hoptrace_collector_kafka_messages_total") > 0:
            first = time.monotonic()
        if first is not None and total("hoptrace_collector_packets_emitted_total") >= packets:
            break
        time.sleep(0.1)
    joined = time.monotonic()
    while time.monotonic() < deadline and total("hoptrace_collector_points_written_total") < 2 * packets:
        time.sleep(0.1)
    written = time.monotonic()
    owned = [scrape(a).get("hoptrace_collector_kafka_partitions_assigned", 0) for a in addrs]
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)
    assert first is not None
    return {
        "collectors": collectors,
        "partitions": partitions,
        "packets": packets,
        "records": records,
        "partitions_owned": owned,
        "join_s": round(joined - first, 2),
        "records_per_s_joined": round(records / (joined - first)),
        "records_per_s_written": round(records / (written - first)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-bench-kafka-"))
    broker = start_kafka()
    influx = start_influxd()
    try:
        for n in args.collectors:
            print(json.dumps(run(n, args.packets, args.partitions, broker, influx, workdir)), flush=True)
    finally:
        broker.stop()
        influx.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
