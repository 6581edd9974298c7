"""Receive stage over Kafka: collectors in one consumer group, each joining the packets of its partitions.

The gRPC receiver (`receiver.py`) serves one collector; with `--kafka-brokers` the agents publish to a topic
instead (`agent/internal/kafka`) and any number of collectors share it:

* every record of one packet, from every node, is in one partition (the agents split each batch by
  `FNV-1a(trace, packet_id) mod partitions`), and every node's heartbeat (counters, watermark, clock) is in
  every partition; so each partition is a complete, ordered stream and gets a `CollectorPipeline` of its
  own (join, aggregation) in whichever collector owns it. Partitions move between collectors when one
  joins, leaves or dies (cooperative-sticky rebalancing): the new owner starts the partition's pipeline
  afresh at its committed offset.
* a partition's offset is committed only once its messages are fully *done*: every packet with a record in
  them emitted (the join's watermark passed their newest record by the join window and two statistics
  intervals) and every point that produced written to InfluxDB (the exporter's write count passed what
  had been queued by then; a spooled point counts once it is replayed). A killed collector loses nothing:
  its partitions are replayed from there by their next owner.
* what is replayed was possibly written before: a replayed packet's `hop_latency` points have the same
  series, timestamp and fields, and InfluxDB keeps one point per series and timestamp, so they overwrite
  themselves (not counted twice). For that, a replay in the same process (a partition lost and assigned
  back) must not take the 1 ns collision shift of the exporter's deduper: `ReplayDeduper` hands a packet
  seen again its first timestamp.
* per-second windows (`segment_stats`, `hop_counters`, `tracer_loss`) are tagged by partition, and a
  window is a sum, not idempotent per packet: the first message of a replay can hold packets of a second
  whose window the previous owner already wrote complete, and writing it again from the replayed packets
  alone would overwrite it with a part. So every commit carries in its metadata the time before which the
  partition's windows were closed and written (`written-before-ns`); the next owner reads it when the
  partition is assigned and leaves out what falls before it (`CollectorPipeline.resume_after`), while the
  windows from it on hold only packets of messages from the committed offset on (a message is done only
  once its newest record is before that time), so the replay writes them whole.
* hop actions and event probes (`hop_counts`, `event_counts`, ...) come as cumulative values in every
  heartbeat, so every partition's owner writes the same growth lines at the same timestamps (the agent
  sends one message to all partitions) and InfluxDB keeps one point each. A partition assigned with a
  commit takes the first values of each node it reads as the baseline: their growth up to there was
  written by the previous owner (and by the other partitions' owners).

Faults: a message without the hoptrace header (another producer on the topic) is counted as foreign and
skipped; one with it that does not decode is counted as malformed and skipped; neither stops the
partition. A topic with fewer partitions than the group has collectors leaves some idle: logged and shown
on /metrics (`hoptrace_collector_kafka_idle`, `..._group_members`, `..._topic_partitions`).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from google.protobuf.message import DecodeError

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import InfluxConfig, InfluxExporter, TimestampDeduper
from hoptrace.collector.metrics import MetricsServer, MetricsWriter, start_metrics_server, write_otlp_metrics
from hoptrace.collector.otlp import beside, start_otlp_exporter
from hoptrace.collector.pipeline import CollectorConfig, CollectorPipeline, start_shared_parts
from hoptrace.collector.receiver import SeenBatches
from hoptrace.collector.records import RecordDecodeError, decode_batch
from hoptrace.v1 import records_pb2

log = logging.getLogger(__name__)

# The agent's marker on every message it publishes (agent/internal/kafka: FormatHeader, FormatValue).
FORMAT_HEADER = "hoptrace-format"
FORMAT_VALUE = b"RecordBatch/v1"

# Commit metadata: the master time before which the partition's windows were written (see the docstring).
WRITTEN_BEFORE_KEY = "written-before-ns="

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass
class KafkaConfig:
    """Where the records are and how to reach them (the `--kafka-*` flags)."""

    brokers: str
    topic: str = "hoptrace-records"
    group: str = "hoptrace-collectors"
    # How long the group waits for a silent collector before giving its partitions to others.
    session_timeout_ms: int = 10_000
    commit_interval_s: float = 1.0
    security_protocol: str = "PLAINTEXT"
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    sasl_mechanism: str | None = None
    sasl_user: str | None = None
    sasl_password: str | None = None
    client_id: str = field(default_factory=lambda: f"hoptrace-collector-{socket.gethostname()}")

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        if not self.brokers or not self.topic or not self.group:
            raise ValueError("kafka: brokers, topic and group are required")
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"kafka: security protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
        sasl = self.security_protocol.startswith("SASL")
        if sasl and (self.sasl_mechanism not in SASL_MECHANISMS or not self.sasl_user):
            raise ValueError(f"kafka: SASL needs a mechanism ({', '.join(SASL_MECHANISMS)}) and a user")
        if bool(self.ssl_cert) != bool(self.ssl_key):
            raise ValueError("kafka: the client certificate and its key go together")
        if self.session_timeout_ms < 1000 or self.commit_interval_s <= 0:
            raise ValueError("kafka: session timeout >= 1000 ms, commit interval > 0")

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings common to the consumer and the admin client."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.brokers,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol,
        }
        for key, value in (
            ("ssl.ca.location", self.ssl_ca),
            ("ssl.certificate.location", self.ssl_cert),
            ("ssl.key.location", self.ssl_key),
            ("sasl.mechanisms", self.sasl_mechanism),
            ("sasl.username", self.sasl_user),
            ("sasl.password", self.sasl_password),
        ):
            if value:
                conf[key] = value
        return conf

    def consumer_config(self) -> dict[str, Any]:
        """The consumer's settings: manual commits only, cooperative rebalancing."""
        return {
            **self.client_config(),
            "group.id": self.group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # A new group reads the topic from its start: nothing published before it is skipped.
            "auto.offset.reset": "earliest",
            # Only the partitions that move are revoked: the others keep their join state.
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": max(300, self.session_timeout_ms // 5),
        }


class ReplayDeduper(TimestampDeduper):
    """`TimestampDeduper` that gives a packet seen again (a partition replayed in this process after a
    rebalance) the timestamp it got the first time, so its points overwrite themselves instead of moving
    1 ns on as a collision and being counted twice. Like its base it remembers each series' timestamps over
    `horizon_ns` of master time (a replay older than that finds its timestamps free again: the same ones),
    each with the packet that took it."""

    def __init__(self, horizon_ns: int = 10_000_000_000) -> None:
        super().__init__(horizon_ns)
        self.replayed = 0

    def same_packet(self, taken: tuple[int, int], time_ns: int, packet_id: int) -> bool:
        """The packet that took a timestamp, whatever time its point had: a replayed packet gets the
        timestamp it got the first time."""
        if taken[1] != packet_id:
            return False
        self.replayed += 1
        return True


class CommitTrackingExporter(InfluxExporter):
    """The InfluxDB exporter, also counting the points `settled` (written, or dropped for good). The exporter
    writes in queue order (the spool is replayed before anything newer), so once `settled` reaches the
    `accepted` of some moment, every point queued before that moment is in InfluxDB: a spooled point is
    not settled, because the partition's next owner may be another collector, without this spool."""

    def __init__(self, config: InfluxConfig) -> None:
        super().__init__(config)
        self.dedupe = ReplayDeduper()

    @property
    def settled(self) -> int:
        """Points accepted and since written to InfluxDB or dropped for good (never to be written)."""
        gone = self.drops["rejected"] + self.drops["spool_overflow"] + self.drops["spool_error"]
        return self.written + gone


@dataclass
class PartitionState:
    """One owned partition: its pipeline, its per-node dedupe, and its messages not committed yet."""

    partition: int
    pipeline: CollectorPipeline
    seen: dict[str, SeenBatches] = field(default_factory=dict)
    # (offset, newest master time of its records; 0 for no records) in offset order
    open: deque[tuple[int, int]] = field(default_factory=deque)
    committed: int = -1  # the offset committed last (the next one to read after a restart)
    # the commit's `written-before-ns` this pipeline resumed after (0: a partition never committed)
    written_before: int = 0


@dataclass
class KafkaStats:
    """What the Kafka stage counted (for /metrics)."""

    messages: int = 0
    records: int = 0
    heartbeats: int = 0
    duplicates: int = 0
    foreign: int = 0
    malformed: int = 0
    commits: int = 0
    commit_errors: int = 0
    consumer_errors: int = 0
    rebalances: int = 0
    partitions_lost: int = 0
    # join counts of the partitions this collector owned before (so the totals are counters, not gauges)
    retired_packets: int = 0
    retired_complete: int = 0
    retired_incomplete: int = 0
    group_members: int = 0
    topic_partitions: int = 0
    records_by_node: dict[str, int] = field(default_factory=dict)


class KafkaCollectorService:
    """A collector consuming the records topic in a consumer group (see the module docstring)."""

    def __init__(
        self, config: CollectorConfig, kafka: KafkaConfig, catalog: TraceCatalog | None = None
    ) -> None:
        config.join.validate()
        config.aggregate.validate()
        config.influx.validate()
        kafka.validate()
        self.config = config
        self.kafka = kafka
        self.catalog, self.time_server = start_shared_parts(config, catalog)
        self.exporter = CommitTrackingExporter(config.influx)
        self.otlp = start_otlp_exporter(config.otlp, self.catalog, config.aggregate)  # None when off
        self.stats = KafkaStats()
        self.partitions: dict[int, PartitionState] = {}
        # (exporter.accepted when taken, {partition: offset to commit})
        self._checkpoints: deque[tuple[int, dict[int, int]]] = deque()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # partitions and stats, against /metrics
        self._idle_warned = False
        self.consumer = Consumer(
            kafka.consumer_config(), logger=logging.getLogger("hoptrace.collector.rdkafka")
        )
        self.consumer.subscribe(
            [kafka.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self.admin = AdminClient(kafka.client_config())
        self.metrics_server: MetricsServer | None = None
        if config.metrics_listen is not None:
            try:
                self.metrics_server = start_metrics_server(config.metrics_listen, self, render_kafka_metrics)
            except OSError as err:
                log.error("/metrics: cannot listen on %s: %s", config.metrics_listen, err)
        self._thread = threading.Thread(target=self._run, name="collector-kafka", daemon=True)
        self._thread.start()
        self._group_thread = threading.Thread(
            target=self._watch_group, name="collector-kafka-group", daemon=True
        )
        self._group_thread.start()
        log.info(
            "collector consuming %s topic %s as group %s, writing %s %s",
            kafka.brokers,
            kafka.topic,
            kafka.group,
            config.influx.url,
            config.influx.bucket,
        )

    # -- partitions ---------------------------------------------------------------------------------------

    def _new_partition(self, partition: int) -> PartitionState:
        # Windows are tagged by partition, not by collector: the partitions' windows of one second add up
        # in the report, and a partition replayed by its next owner overwrites its own windows.
        aggregate = dataclasses.replace(
            self.config.aggregate, instance=f"{self.kafka.topic}/partition-{partition}"
        )
        pipeline = CollectorPipeline(
            beside(self.exporter, self.otlp), self.catalog, self.config.join, aggregate, self.config.capture
        )
        return PartitionState(partition, pipeline)

    def _written_before(self, consumer: Consumer, partitions: list[TopicPartition]) -> dict[int, int]:
        """Per committed partition, the `written-before-ns` of its last commit (0: a commit without it;
        absent: never committed)."""
        last_err: Exception | None = None
        for _ in range(3):
            try:
                committed = consumer.committed(partitions, timeout=10)
            except KafkaException as err:
                last_err = err
                continue
            return {
                tp.partition: parse_written_before(tp.metadata)
                for tp in committed
                if tp.error is None and tp.offset >= 0
            }
        # Without it the replay's first seconds may be written again from a part of their packets.
        log.error(
            "kafka: cannot read the commits of partitions %s (%s): their replayed seconds may count low",
            [tp.partition for tp in partitions],
            last_err,
        )
        return {}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        written = self._written_before(consumer, partitions)
        with self._lock:
            for tp in partitions:
                state = self._new_partition(tp.partition)
                if tp.partition in written:  # committed before: resume after what was written
                    before = written[tp.partition]
                    state.pipeline.resume_after(before)
                    state.written_before = before
                self.partitions[tp.partition] = state
            self.stats.rebalances += 1
            owned = sorted(self.partitions)
        log.info(
            "kafka: assigned partitions %s (windows written before %s), own %s",
            [tp.partition for tp in partitions],
            {p: written[p] for p in sorted(written)},
            owned,
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what is done; the rest is replayed by the next owner (idempotent points).
        self._take_checkpoint()
        self._commit_settled(wait_s=2.0)
        self._drop(partitions, "revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.stats.partitions_lost += len(partitions)
        self._drop(partitions, "lost")

    def _drop(self, partitions: list[TopicPartition], why: str) -> None:
        with self._lock:
            for tp in partitions:
                state = self.partitions.pop(tp.partition, None)
                if state is not None:
                    join = state.pipeline.joiner.stats
                    self.stats.retired_packets += join.packets
                    self.stats.retired_complete += join.complete
                    self.stats.retired_incomplete += join.incomplete
                if state is not None and state.pipeline.joiner.pending():
                    log.info(
                        "kafka: partition %d %s with %d packets in its join: its next owner replays them",
                        tp.partition,
                        why,
                        state.pipeline.joiner.pending(),
                    )
            self.stats.rebalances += 1
            owned = sorted(self.partitions)
        log.info("kafka: partitions %s %s, own %s", [tp.partition for tp in partitions], why, owned)

    # -- the consumer loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        tick_at = commit_at = time.monotonic()
        while not self._stop.is_set():
            try:
                tick_at, commit_at = self._run_once(tick_at, commit_at)
            except KafkaException as err:  # a consumer error: log, count, go on
                self.stats.consumer_errors += 1
                log.error("kafka consume: %s", err)
                time.sleep(0.5)
            except Exception as err:  # noqa: BLE001 - a bug must not stop consuming (nor show a traceback)
                self.stats.consumer_errors += 1
                log.error("kafka consumer loop: %r", err)
                log.debug("kafka consumer loop", exc_info=True)
                time.sleep(0.5)

    def _run_once(self, tick_at: float, commit_at: float) -> tuple[float, float]:
        """Consume what is there (up to 500 messages, 0.1 s), tick the pipelines, commit what is done."""
        for msg in self.consumer.consume(num_messages=500, timeout=0.1):
            try:
                self._handle(msg)
            except Exception as err:  # noqa: BLE001 - one bad message must not stop the partition
                self.stats.malformed += 1
                log.error(
                    "kafka: message at partition %s offset %s skipped: %r", msg.partition(), msg.offset(), err
                )
                log.debug("kafka: message skipped", exc_info=True)
        now = time.monotonic()
        if now >= tick_at:
            tick_at = now + self.config.tick_s
            for state in list(self.partitions.values()):
                state.pipeline.tick()
        if now >= commit_at:
            commit_at = now + self.kafka.commit_interval_s
            self._take_checkpoint()
            self._commit_settled()
        return tick_at, commit_at

    def _handle(self, msg: Any) -> None:
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                self.stats.consumer_errors += 1
                log.warning("kafka: %s", err)
            return
        state = self.partitions.get(msg.partition())
        if state is None:  # revoked meanwhile
            return
        offset = msg.offset()
        newest = 0
        batch = self._decode(msg)
        if batch is not None:
            node_seen = state.seen.setdefault(batch.node, SeenBatches())
            is_new, _ = node_seen.add(batch.batch_seq)
            if not is_new:
                self.stats.duplicates += 1
            else:
                state.pipeline.consume(batch)
                self.stats.messages += 1
                if batch.records:
                    n = len(batch.records)
                    self.stats.records += n
                    self.stats.records_by_node[batch.node] = self.stats.records_by_node.get(batch.node, 0) + n
                    mapping = state.pipeline.clock.mapping(batch.node)
                    newest = mapping.to_master(max(r[0] for r in batch.records))
                else:
                    self.stats.heartbeats += 1
                    newest = self._heartbeat_time(state, batch)
        state.open.append((offset, newest))

    @staticmethod
    def _heartbeat_time(state: PartitionState, batch: Any) -> int:
        """The newest window a heartbeat's counters and agent drops went into (master time; 0 for none):
        its message is done only once that window is written, like a record's."""
        if not batch.counters and not batch.agent_dropped:
            return 0
        pipeline = state.pipeline
        # Counters without a time, drops and late ones go to the watermark's or the oldest open window.
        newest = max(pipeline.joiner.watermark_ns, pipeline.segments.closed_before)
        for c in batch.counters:
            if c.HasField("at"):
                newest = max(newest, pipeline.clock.wall_to_master(batch.node, c.at.ToNanoseconds()))
        return newest

    def _decode(self, msg: Any) -> Any:
        """The message's DecodedBatch, or None (counted) for a foreign or malformed one."""
        headers = dict(msg.headers() or [])
        if headers.get(FORMAT_HEADER) != FORMAT_VALUE:
            self.stats.foreign += 1
            if self.stats.foreign == 1 or self.stats.foreign % 1000 == 0:
                log.warning(
                    "kafka: %d messages without the hoptrace header skipped (partition %d offset %d)",
                    self.stats.foreign,
                    msg.partition(),
                    msg.offset(),
                )
            return None
        try:
            pb = records_pb2.RecordBatch.FromString(msg.value() or b"")
            return decode_batch(pb)
        except (DecodeError, RecordDecodeError) as err:
            self.stats.malformed += 1
            log.warning(
                "kafka: malformed message at partition %d offset %d: %s", msg.partition(), msg.offset(), err
            )
            return None

    # -- commits ------------------------------------------------------------------------------------------

    def _done_before(self, state: PartitionState) -> int:
        """Master time before which every packet of this partition is emitted and its windows closed."""
        join = self.config.join
        interval = self.config.aggregate.interval_ns
        return state.pipeline.joiner.watermark_ns - join.window_ns - 2 * interval

    def _take_checkpoint(self) -> None:
        """Note, per partition, the offset up to which every message is done in the join and aggregation,
        with the time before which its windows are closed (all handed to the exporter by now); both are
        committed once the points queued so far are written (`_commit_settled`)."""
        ready: dict[int, tuple[int, int]] = {}
        for p, state in list(self.partitions.items()):
            closed = state.pipeline.segments.closed_before
            # a message before the offset has nothing in a window from `closed` on (the replay's windows)
            upto = min(self._done_before(state), closed)
            last = None
            while state.open and state.open[0][1] < upto:
                last = state.open.popleft()[0]
            if last is not None:
                ready[p] = (last + 1, closed)
        if ready:
            self._checkpoints.append((self.exporter.accepted, ready))

    def _commit_settled(self, wait_s: float = 0.0) -> None:
        """Commit the checkpoints whose points are all written (waiting up to `wait_s` for them)."""
        deadline = time.monotonic() + wait_s
        offsets: dict[int, tuple[int, int]] = {}
        while self._checkpoints:
            accepted, ready = self._checkpoints[0]
            if self.exporter.settled < accepted:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
                continue
            self._checkpoints.popleft()
            offsets.update(ready)
        commit = [
            TopicPartition(self.kafka.topic, p, off, metadata=f"{WRITTEN_BEFORE_KEY}{written}")
            for p, (off, written) in sorted(offsets.items())
            if p in self.partitions and off > self.partitions[p].committed
        ]
        if not commit:
            return
        try:
            self.consumer.commit(offsets=commit, asynchronous=False)
        except KafkaException as err:  # e.g. a rebalance in progress: the next round commits again
            self.stats.commit_errors += 1
            log.warning("kafka: commit failed: %s", err)
            for tp in commit:  # keep them for the next round
                written = parse_written_before(tp.metadata)
                self._checkpoints.appendleft((0, {tp.partition: (tp.offset, written)}))
            return
        self.stats.commits += 1
        for tp in commit:
            self.partitions[tp.partition].committed = tp.offset

    # -- the group ----------------------------------------------------------------------------------------

    def _watch_group(self) -> None:
        """Every 10 s: the group's members against the topic's partitions; too few partitions is reported."""
        while not self._stop.wait(10.0):
            try:
                topics = self.admin.list_topics(self.kafka.topic, timeout=5)
                meta = topics.topics.get(self.kafka.topic)
                parts = len(meta.partitions) if meta is not None and meta.error is None else 0
                groups = self.admin.describe_consumer_groups([self.kafka.group], request_timeout=5)
                members = len(groups[self.kafka.group].result(timeout=10).members)
            except Exception as err:  # noqa: BLE001 - brokers away: the consumer logs that already
                log.debug("kafka: group check failed: %s", err)
                continue
            self.stats.topic_partitions, self.stats.group_members = parts, members
            if parts and members > parts:
                if not self._idle_warned:
                    log.warning(
                        "kafka: topic %s has %d partitions for %d collectors in group %s: %d idle; "
                        "add partitions (kafka-topics --alter --partitions N)",
                        self.kafka.topic,
                        parts,
                        members,
                        self.kafka.group,
                        members - parts,
                    )
                    self._idle_warned = True
            else:
                self._idle_warned = False

    # -- lifecycle ----------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop consuming, write what is queued, commit what is done, leave the group (others take over)."""
        self._stop.set()
        self._thread.join(timeout_s)
        for state in list(self.partitions.values()):
            state.pipeline.tick()
        self._take_checkpoint()
        self.exporter.flush(timeout_s, give_up_when_down=True)
        self._commit_settled()
        self._leave_group()
        try:
            self.consumer.close()
        except KafkaException as err:
            log.warning("kafka: close: %s", err)
        self.exporter.close()
        if self.otlp is not None:
            self.otlp.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.time_server is not None:
            self.time_server.stop()
        log.info("collector stopped: %s", self.stats)

    def _leave_group(self, timeout_s: float = 10.0) -> None:
        """Unsubscribe and serve the revocation until nothing is assigned: `Consumer.close()` straight
        from a cooperative assignment hung past 30 s in 3 of 5 runs of the backlog test (librdkafka
        2.16, the group rebalancing as this collector left; it never reached the revoke callback).
        Messages polled meanwhile are not handled: their partitions go to the next owner, which reads
        them from the commit."""
        try:
            self.consumer.unsubscribe()
            deadline = time.monotonic() + timeout_s
            while self.consumer.assignment() and time.monotonic() < deadline:
                self.consumer.consume(num_messages=500, timeout=0.1)
        except KafkaException as err:
            log.warning("kafka: leaving the group: %s", err)


def render_kafka_metrics(service: KafkaCollectorService) -> str:
    """/metrics of a Kafka collector: the stage's own counters and the join and export ones, summed."""
    st = service.stats
    exp = service.exporter
    with service._lock:
        states = list(service.partitions.values())
    w = MetricsWriter()
    w.metric(
        "records_received_total",
        "counter",
        "Records received from agents.",
        [({"node": n}, v) for n, v in sorted(st.records_by_node.items())],
    )
    w.one("kafka_messages_total", "counter", "hoptrace messages consumed (duplicates excluded).", st.messages)
    w.one(
        "kafka_heartbeats_total",
        "counter",
        "Heartbeat messages (counters, watermark) consumed.",
        st.heartbeats,
    )
    w.one(
        "kafka_duplicates_total",
        "counter",
        "Messages seen again (node, batch_seq) and skipped.",
        st.duplicates,
    )
    w.metric(
        "kafka_skipped_total",
        "counter",
        "Messages skipped: foreign (no hoptrace header) or malformed (undecodable).",
        [({"reason": "foreign"}, st.foreign), ({"reason": "malformed"}, st.malformed)],
    )
    w.one(
        "kafka_replayed_points_total",
        "counter",
        "hop_latency points made again for replayed packets (written over themselves, not twice).",
        getattr(exp.dedupe, "replayed", 0),
    )
    w.one("kafka_commits_total", "counter", "Offset commits (after the points were written).", st.commits)
    w.one("kafka_commit_errors_total", "counter", "Offset commits that failed (retried).", st.commit_errors)
    w.one("kafka_consumer_errors_total", "counter", "Errors the consumer reported.", st.consumer_errors)
    w.one("kafka_rebalances_total", "counter", "Partition assignments and revocations.", st.rebalances)
    w.one("kafka_partitions_assigned", "gauge", "Partitions this collector owns.", len(states))
    w.one(
        "kafka_topic_partitions",
        "gauge",
        "Partitions of the topic (checked every 10 s).",
        st.topic_partitions,
    )
    w.one(
        "kafka_group_members",
        "gauge",
        "Collectors in the consumer group (checked every 10 s).",
        st.group_members,
    )
    idle = 1 if st.topic_partitions and st.group_members > st.topic_partitions else 0
    w.one("kafka_idle", "gauge", "1 when the topic has fewer partitions than the group has collectors.", idle)
    w.one(
        "kafka_uncommitted_messages",
        "gauge",
        "Messages consumed whose offsets wait for their packets to be written.",
        sum(len(s.open) for s in states),
    )
    joins = [s.pipeline.joiner.stats for s in states]
    w.one(
        "packets_emitted_total",
        "counter",
        "Packets the join emitted (a replayed packet again).",
        st.retired_packets + sum(j.packets for j in joins),
    )
    w.one(
        "packets_complete_total",
        "counter",
        "Packets seen at every hop.",
        st.retired_complete + sum(j.complete for j in joins),
    )
    w.one(
        "packets_incomplete_total",
        "counter",
        "Packets missing a hop.",
        st.retired_incomplete + sum(j.incomplete for j in joins),
    )
    w.one(
        "join_pending_packets",
        "gauge",
        "Packets waiting in the join windows.",
        sum(s.pipeline.joiner.pending() for s in states),
    )
    w.metric(
        "dropped_total",
        "counter",
        "Points the exporter dropped, by reason.",
        [
            ({"reason": r}, exp.drops.get(r, 0))
            for r in ("closed", "queue_full", "rejected", "spool_error", "spool_overflow")
        ],
    )
    w.one("export_queue_points", "gauge", "Points waiting in memory for the exporter.", exp.pending)
    w.one("spool_points", "gauge", "Points spooled on disk.", exp.spool_points)
    w.one("points_written_total", "counter", "Points InfluxDB accepted.", exp.written)
    w.one("influx_up", "gauge", "1 while InfluxDB takes writes.", 0 if exp.failing else 1)
    write_otlp_metrics(w, service.otlp)
    return "\n".join(w.lines) + "\n"


def parse_written_before(metadata: str | None) -> int:
    """The `written-before-ns` of a commit's metadata; 0 for none (a commit of an older collector)."""
    if metadata and metadata.startswith(WRITTEN_BEFORE_KEY):
        try:
            return max(0, int(metadata[len(WRITTEN_BEFORE_KEY) :]))
        except ValueError:
            pass
    return 0


def read_secret_file(path: str | None) -> str | None:
    """The first line of a secret file, or None."""
    return Path(path).read_text().strip() if path else None
