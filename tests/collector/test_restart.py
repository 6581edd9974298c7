"""A collector restarted while agents stream: the join holds a backlog until the trace paths come, an exemplar
leaves with its window (so the written-before mark covers it), and a stop that cuts the agents' streams
marks only the windows its watermark closed. What a restart must not do: lose packets or write one twice.

No InfluxDB: the exporter writes to a closed port, so every point goes to the spool, whose line protocol
files are read back."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from collector_helpers import batch, pid, rec

from hoptrace import kernel_abi
from hoptrace.collector.aggregate import AggregateConfig, HopCounterAggregator
from hoptrace.collector.catalog import TraceCatalog
from hoptrace.collector.influx import InfluxConfig
from hoptrace.collector.join import HopJoiner, JoinConfig
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.points import Point
from hoptrace.collector.receiver import ReceiverConfig
from hoptrace.collector.records import decode_batch
from hoptrace.collector.schema import END_TO_END, HOP_LATENCY, SEGMENT_STATS
from hoptrace.collector.service import CollectorConfig, CollectorService, WrittenBeforeMark, start_collector
from hoptrace.v1 import records_pb2, records_pb2_grpc

pytestmark = pytest.mark.unit  # pure code and loopback sockets: make test-unit runs it without root

SEC = 1_000_000_000
TRACE = "restart"
HOPS = ["a-out", "a-br", "b-in"]
NODES = ["node-a", "node-a", "node-b"]
SEGMENTS = {"a-out>a-br", "a-br>b-in", END_TO_END}
PER_SECOND = 50


def second(
    base: int, s: int, seq: int | None = None
) -> tuple[records_pb2.RecordBatch, records_pb2.RecordBatch]:
    """One second of master time: node-a's records (hops 0, 1) and node-b's (hop 2); clocks are 0."""
    a, b = [], []
    for k in range(PER_SECOND):
        i = s * PER_SECOND + k
        t0 = base + s * SEC + k * (SEC // PER_SECOND)
        a += [rec(t0, pid(i + 1), 0), rec(t0 + 2_000, pid(i + 1), 1)]
        b.append(rec(t0 + 60_000, pid(i + 1), 2))
    n = s + 1 if seq is None else seq
    return batch("node-a", TRACE, a, seq=n, clock_delta=0), batch("node-b", TRACE, b, seq=n, clock_delta=0)


def paths() -> TraceCatalog:
    catalog = TraceCatalog()
    catalog.set_trace(TRACE, HOPS, NODES)
    return catalog


def test_the_join_holds_a_backlog_until_the_paths_come() -> None:
    """A restarted collector gets the agents' backlog before the dispatcher's specs: the join holds it (the
    watermark stands still) and, once the paths come, every packet leaves complete on them. Without them it
    would leave incomplete, on a path of `hop<i>` names."""
    base = 100 * SEC
    catalog = TraceCatalog()
    catalog.expect_paths()  # following a dispatcher that has not answered yet
    joiner = HopJoiner(catalog, JoinConfig(window_ns=SEC))
    now = 0
    backlog = [decode_batch(m) for s in range(5) for m in second(base, s)]
    for b in backlog:
        assert joiner.join_hops(b.trace, b.node, b.records, now_ns=now) == []
    assert joiner.tick(now + 10 * SEC) == [] and joiner.pending() == 5 * PER_SECOND
    catalog.set_trace(TRACE, HOPS, NODES)
    catalog.paths_synced()
    out = joiner.tick(now + 10 * SEC) + joiner.flush()
    assert len(out) == 5 * PER_SECOND and all(p.complete for p in out), Counter(p.complete for p in out)

    # The hold lasts at most node_timeout_ns: a dispatcher that never answers does not hold records forever.
    waiting = TraceCatalog()
    waiting.expect_paths()
    joiner = HopJoiner(waiting, JoinConfig(window_ns=SEC, node_timeout_ns=20 * SEC))
    for b in backlog:
        joiner.join_hops(b.trace, b.node, b.records, now_ns=now)
    assert joiner.tick(now + 19 * SEC) == []
    for node in ("node-a", "node-b"):
        joiner.heard_from(node, 0, now + 21 * SEC)  # their heartbeats: alive
    left = joiner.tick(now + 21 * SEC)  # the last second waits for its window
    assert len(left) == 4 * PER_SECOND and not any(p.complete for p in left)


class Points:
    """An exporter that keeps what it is given, one list per export call."""

    def __init__(self) -> None:
        self.calls: list[list[Point]] = []

    def export(self, points: list[Point]) -> None:
        self.calls.append(list(points))


def test_an_exemplar_leaves_with_its_window() -> None:
    """Exemplars sampled by ID (every packet here) leave in the export that closes their window, never
    before: a written-before mark past a window covers its exemplars too."""
    base = 100 * SEC
    points = Points()
    pipeline = CollectorPipeline(
        points, paths(), JoinConfig(window_ns=SEC), AggregateConfig(exemplar_every=1)
    )
    for s in range(6):
        for m in second(base, s):
            pipeline.consume(decode_batch(m))
    pipeline.flush()
    windows: set[int] = set()
    seen = 0
    for call in points.calls:
        closed = {p.time_ns for p in call if p.measurement == SEGMENT_STATS}
        windows |= closed
        for p in call:
            if p.measurement == HOP_LATENCY:
                seen += 1
                assert p.time_ns - p.time_ns % SEC in windows, "an exemplar left before its window closed"
    assert seen == 6 * PER_SECOND * len(SEGMENTS)


def test_a_resumed_pipeline_writes_no_exemplar_before_its_mark() -> None:
    """The records an agent resends to a restarted collector are joined again; the exemplars of the windows
    before the mark (written by its predecessor) are not written again, those after it are, once."""
    base = 100 * SEC
    points = Points()
    pipeline = CollectorPipeline(
        points, paths(), JoinConfig(window_ns=SEC), AggregateConfig(exemplar_every=1)
    )
    pipeline.resume_after(base + 3 * SEC)
    for s in range(6):
        for m in second(base, s):
            pipeline.consume(decode_batch(m))
    pipeline.flush()
    exemplars = [p for call in points.calls for p in call if p.measurement == HOP_LATENCY]
    assert {p.time_ns - p.time_ns % SEC - base for p in exemplars} == {3 * SEC, 4 * SEC, 5 * SEC}
    assert len(exemplars) == 3 * PER_SECOND * len(SEGMENTS)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens: every batch goes to the spool


def _spooled(spool: Path) -> list[str]:
    return [line for path in sorted(spool.glob("*.lp")) for line in path.read_text().splitlines() if line]


def _tag(line: str, key: str) -> str:
    return next(t.split("=", 1)[1] for t in line.split(" ", 1)[0].split(",")[1:] if t.startswith(key + "="))


def _field(line: str, key: str) -> str:
    return next(f.split("=", 1)[1] for f in line.split(" ")[1].split(",") if f.startswith(key + "="))


def test_a_stop_that_cuts_streams_leaves_the_open_windows_to_the_next_collector(tmp_path: Path) -> None:
    """SIGTERM while agents stream: the stop writes and marks the windows its watermark closed, and leaves
    the rest (packets in the join, open windows) to the next collector, which the agents resend it to. Over
    both collectors every window is written once with all its packets, and every exemplar once."""
    spool = tmp_path / "spool"
    config = CollectorConfig(
        receiver=ReceiverConfig(listen="127.0.0.1:0"),
        join=JoinConfig(window_ns=SEC),
        aggregate=AggregateConfig(exemplar_every=1),
        influx=InfluxConfig(url=_closed_port(), spool_dir=str(spool), flush_interval_s=0.1, retry_max_s=60),
        clock_listen=None,
        metrics_listen=None,
        create_database=False,
    )
    base = (time.time_ns() // SEC - 120) * SEC
    seconds = 10

    first = start_collector(config, paths())
    release = threading.Event()

    def agent(node: int) -> Iterator[records_pb2.RecordBatch]:
        yield from (second(base, s)[node] for s in range(6))
        release.wait(30)  # the agent streams on: the stop cuts its stream

    streams = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{first.port}") as channel:
            stub = records_pb2_grpc.CollectorStub(channel)
            streams = [stub.StreamRecords.future(agent(node)) for node in (0, 1)]
            deadline = time.monotonic() + 10
            while sum(n.records for n in first.receiver.stats_snapshot().values()) < 6 * 3 * PER_SECOND:
                assert time.monotonic() < deadline, first.receiver.stats_snapshot()
                time.sleep(0.02)
            first.stop(grace_s=0.2)
            release.set()
            for call in streams:
                with pytest.raises(grpc.RpcError):
                    call.result(timeout=10)
    finally:
        release.set()
    # node-b's newest record is 5.99 s in: windows end 1 s (the join window) and 1 s (the window's) before
    mark = WrittenBeforeMark(str(spool)).read()
    assert mark == base + 3 * SEC, (mark - base) / SEC

    second_collector = CollectorService(config, paths())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{second_collector.port}") as channel:
            stub = records_pb2_grpc.CollectorStub(channel)
            # the agents resend what their cut streams had sent (seconds 0-5), then stream on (6-9)
            for s in range(seconds):
                for m in second(base, s, seq=100 + s):
                    assert stub.StreamRecords(iter([m])).batches == 1
        stats = second_collector.pipeline.stats()
    finally:
        second_collector.stop()
    assert stats["late_records"] == 3 * 3 * PER_SECOND, stats  # seconds 0-2: the first one wrote them

    lines = _spooled(spool)
    windows = Counter(
        (_tag(line, "segment"), int(line.rsplit(" ", 1)[1]) - base)
        for line in lines
        if line.startswith(SEGMENT_STATS + ",")
    )
    assert windows == Counter({(seg, s * SEC): 1 for seg in SEGMENTS for s in range(seconds)}), windows
    complete = sum(
        int(_field(line, "complete").rstrip("i"))
        for line in lines
        if line.startswith(SEGMENT_STATS + ",") and _tag(line, "segment") == END_TO_END
    )
    assert complete == seconds * PER_SECOND
    exemplars = Counter(
        (_tag(line, "segment"), _field(line, "packet_id"))
        for line in lines
        if line.startswith(HOP_LATENCY + ",")
    )
    assert len(exemplars) == seconds * PER_SECOND * len(SEGMENTS) and set(exemplars.values()) == {1}


def test_a_resumed_pipeline_counts_a_hop_s_counters_from_its_first_report() -> None:
    """A hop's counters are cumulative since it was attached: after a restart its first report sets the
    base (what it holds was counted by the predecessor; in full, a hop's ring-buffer losses would come back
    as tracer loss), unless the hop was attached after the resume point (then its counters are all new)."""
    matched = kernel_abi.COUNTERS.index("matched")
    full = kernel_abi.COUNTERS.index("ringbuf_full")

    def report(hop: int, count: int, at: int, attached: int) -> records_pb2.HopCounters:
        values = [0] * len(kernel_abi.COUNTERS)
        values[matched], values[full] = count, count // 100
        c = records_pb2.HopCounters(hop=f"h{hop}", hop_index=hop, values=values, attached_ns=attached)
        c.at.FromNanoseconds(at)
        return c

    base = 100 * SEC
    counters = HopCounterAggregator()  # no clock: attach times are master times
    counters.resume_after(base + 3 * SEC)
    lost = []
    for s in range(5, 8):  # h0 attached long before the restart, h1 after it
        at = base + s * SEC
        lost += counters.add_counters(
            "t", "n", [report(0, 100 * (s + 1), at, 1), report(1, 100 * (s - 4), at, at)]
        )
    windows = {(w.hop, (w.start_ns - base) // SEC): w.matched for w in counters.flush()}
    assert windows == {
        ("h0", 5): 0,
        ("h0", 6): 100,
        ("h0", 7): 100,
        ("h1", 5): 100,
        ("h1", 6): 100,
        ("h1", 7): 100,
    }
    # a record lost a second at each hop, h0's 6 lost before the restart not among them
    assert lost == [("h1", base + 5 * SEC, 1)] + [
        (h, base + s * SEC, 1) for s in (6, 7) for h in ("h0", "h1")
    ]
