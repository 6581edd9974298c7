"""A real Apache Kafka broker for the tests: KRaft mode (broker and controller in one JVM), all state in a
temporary directory, loopback listeners on free ports. The jars come from Maven Central (`make kafka`, run by
`make setup`: `lab/kafka/pom.xml` into `.tools/kafka/libs`).

Like `start_influxd`: `start_kafka()` returns a running `KafkaBroker`; `stop_process()` / `restart()` keep its
data and ports (an outage), `stop()` removes everything.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from hoptrace.collector.kafka import FORMAT_HEADER, FORMAT_VALUE
from hoptrace.collector.records import RECORD_SIZE, pack_records
from hoptrace.lab.lifecycle import dies_with_parent
from hoptrace.lab.processes import REPO_ROOT, free_port
from hoptrace.v1 import records_pb2

KAFKA_LIBS = REPO_ROOT / ".tools" / "kafka" / "libs"
JAVA = shutil.which("java") or "/usr/bin/java"


def _server_properties(workdir: Path, port: int, controller_port: int) -> str:
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={workdir}/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
"""


_LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        Pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
"""


@dataclass
class KafkaBroker:
    """A running single-node Kafka (KRaft) on loopback."""

    bootstrap: str
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    command: list[str] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        """The broker's output."""
        return self.workdir / "kafka.log"

    def admin(self) -> AdminClient:
        """An admin client of this broker."""
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int, timeout_s: float = 30.0) -> None:
        """Create a topic (replication 1) and wait until every partition has a leader."""
        admin = self.admin()
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(
            timeout_s
        )
        self._wait_partitions(admin, name, partitions, timeout_s)

    def add_partitions(self, name: str, total: int, timeout_s: float = 30.0) -> None:
        """Grow a topic to `total` partitions."""
        admin = self.admin()
        admin.create_partitions([NewPartitions(name, total)])[name].result(timeout_s)
        self._wait_partitions(admin, name, total, timeout_s)

    @staticmethod
    def _wait_partitions(admin: AdminClient, name: str, partitions: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=5).topics.get(name)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                return
            time.sleep(0.1)
        raise TimeoutError(
            f"topic {name}: {partitions} partitions with leaders not there after {timeout_s} s"
        )

    def produce(
        self, topic: str, value: bytes, partition: int, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        """Publish one message (e.g. a foreign or malformed one) and wait for the acknowledgement."""
        producer = Producer({"bootstrap.servers": self.bootstrap})
        producer.produce(topic, value=value, partition=partition, headers=headers or [])
        if producer.flush(30) != 0:
            raise TimeoutError("the broker did not acknowledge the message")

    def stop_process(self) -> None:
        """Kill the broker (SIGKILL: an outage, not a clean shutdown), keeping its data and ports."""
        proc = self.process
        assert proc is not None and proc.poll() is None
        proc.kill()
        proc.wait()

    def restart(self, timeout_s: float = 60.0) -> None:
        """Start the broker again on the same data and ports; wait until it answers."""
        self._spawn()
        if not _wait_port(self.bootstrap, timeout_s, self.process):
            raise RuntimeError(f"kafka did not restart; its log:\n{_tail(self.log_path)}")

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                dies_with_parent(self.command), stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self) -> None:
        """Stop the broker (SIGTERM, SIGKILL after 15 s) and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_port(addr: str, timeout_s: float, proc: subprocess.Popen[bytes] | None) -> bool:
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _cluster_id() -> str:
    """A random KRaft cluster ID; like Kafka's own, never one starting with '-', which the
    storage tool's argument parser would take for an option (1 run in 64 otherwise)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def start_kafka(timeout_s: float = 90.0, heap: str = "512m") -> KafkaBroker:
    """Format a KRaft log directory and start the broker; returns once it serves metadata."""
    if not KAFKA_LIBS.is_dir() or not any(KAFKA_LIBS.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"{KAFKA_LIBS} is missing: run `make setup` (or `make kafka`)")
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-kafka-"))
    port, controller_port = free_port(), free_port()
    props = workdir / "server.properties"
    props.write_text(_server_properties(workdir, port, controller_port))
    (workdir / "log4j2.yaml").write_text(_LOG4J2)
    java = [JAVA, f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    java += [f"-Dlog4j2.configurationFile={workdir / 'log4j2.yaml'}", "-cp", f"{KAFKA_LIBS}/*"]
    cluster_id = _cluster_id()
    fmt = subprocess.run(
        [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if fmt.returncode != 0:
        shutil.rmtree(workdir, ignore_errors=True)
        raise RuntimeError(f"kafka storage format failed:\n{fmt.stdout}\n{fmt.stderr}")
    broker = KafkaBroker(
        bootstrap=f"127.0.0.1:{port}", workdir=workdir, command=[*java, "kafka.Kafka", str(props)]
    )
    broker._spawn()
    if not _wait_port(broker.bootstrap, timeout_s, broker.process):
        error = _tail(broker.log_path)
        broker.stop()
        raise RuntimeError(f"kafka did not start; its log:\n{error}")
    # serving metadata (the controller elected itself)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            broker.admin().list_topics(timeout=5)
            return broker
        except Exception as err:  # noqa: BLE001 - KafkaException until the broker is ready
            if time.monotonic() > deadline:
                broker.stop()
                raise RuntimeError(f"kafka serves no metadata: {err}") from err
            time.sleep(0.2)


_HOPTRACE_HEADER = [(FORMAT_HEADER, FORMAT_VALUE)]  # the agent's marker on its messages
_SEC = 1_000_000_000


def publish_backlog(
    bootstrap: str, topic: str, trace: str, packets: int, partitions: int, batch: int = 1024
) -> int:
    """Publish `packets` packets of a 2-hop trace (node-a hop 0, node-b hop 1) as the agents would (each
    node's `batch`-packet batches split by partition, then a heartbeat per partition), 5,000 packets per
    second of master time ending two minutes ago, and a last heartbeat at now that lets every packet out
    of the join; returns the records."""
    # Idempotent, as the agents' franz-go producer is: each partition stays in the order produced. Without
    # it a produce request retried behind later ones put a partition's first seconds after newer records
    # and heartbeats (2 of 6 topics published on a busy machine here), and the collectors' join rightly
    # found them late: the "backlog rebalance loss" (records left behind when a rebalance moved a partition).
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "enable.idempotence": True,
        }
    )
    rate = 5_000  # packets per second of master time
    base = time.time_ns() - (packets // rate + 120) * _SEC
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
            producer.produce(topic, msg.SerializeToString(), partition=p, headers=_HOPTRACE_HEADER)
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
            producer.produce(topic, beat.SerializeToString(), partition=p, headers=_HOPTRACE_HEADER)
        producer.poll(0)

    for start in range(0, packets, batch):
        ids = range(start, min(start + batch, packets))
        a = [(base + i * _SEC // rate, (7 << 24) | i, 0xABCD, 3, 100, 0, 1, 0, 0) for i in ids]
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
