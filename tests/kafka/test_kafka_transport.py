"""The Kafka transport on a real broker, the real kernel and a real InfluxDB: agents publish, collectors of
one consumer group join their partitions; a collector killed and one added, the broker down for ~20 s,
foreign and malformed messages, and a topic with too few partitions."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format

from hoptrace.dispatcher.compile import event_attach
from hoptrace.lab.influx import BUCKET, distinct_packets, segment_counts
from hoptrace.lab.kafka import publish_backlog
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.processes import AgentProcess, free_port, udp_transfer
from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import path_plans, vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.results.report_view import report_from_proto
from hoptrace.results.store import read_report
from hoptrace.spec import spec_from_data
from hoptrace.v1 import records_pb2

PORT = 7788
SEGMENTS = 8  # 7 hop-to-hop segments of the 8-hop VXLAN path and end_to_end


class UdpFlow:
    """Numbered UDP datagrams c1 -> c2 (198.18.0.0/15 addresses of the topology) at a steady rate."""

    def __init__(self, topo: TwoHostTopology, rate_pps: float) -> None:
        self.topo, self.rate_pps, self.sent = topo, rate_pps, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with self.topo.socket("c1", socket.AF_INET, socket.SOCK_DGRAM) as sock:
            target = (self.topo.addr("c2"), PORT)
            gap, next_at = 1.0 / self.rate_pps, time.monotonic()
            while not self._stop.is_set():
                sock.sendto(self.sent.to_bytes(8, "big") + os.urandom(56), target)
                self.sent += 1
                next_at += gap
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)

    def start(self) -> UdpFlow:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.sent


def traced_path(topo: TwoHostTopology, trace: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The spec (for the collectors' --traces) and the two agents' plans of the c1 -> c2 UDP flow."""
    spec = json_format.MessageToDict(vxlan_path_spec(topo, trace, port=PORT))
    plan_a, plan_b = path_plans(
        topo, trace, {"protocol": "udp", "src": topo.addr("c1"), "dst": topo.addr("c2"), "dstPort": PORT}
    )
    return spec, plan_a, plan_b


def start_agents(
    agent_factory: Callable[..., AgentProcess],
    topo: TwoHostTopology,
    plans: tuple,
    bootstrap: str,
    topic: str,
) -> list[tuple[AgentProcess, str]]:
    """Both hosts' agents publishing to `topic`; each with its /metrics address."""
    out = []
    for plan, node, netns in ((plans[0], "host-a", topo.host_a), (plans[1], "host-b", topo.host_b)):
        metrics = f"127.0.0.1:{free_port()}"
        extra = ("--kafka-brokers", bootstrap, "--kafka-topic", topic, "--clock-server", "off")
        agent = agent_factory(plan, node, netns, (*extra, "--metrics-listen", metrics))
        status = agent.wait_status()
        assert status.get("active") and all(h.get("attached") for h in status["hops"]), status
        out.append((agent, metrics))
    return out


def tagged_at_exit(agent: AgentProcess) -> int:
    """The tagger's (hop 0) `tagged` counter in the agent's last counters line."""
    last = [c for c in agent.counters if int(c["hop_index"]) == 0][-1]
    return int(last["tagged"])


def wait_points(
    influx_url: str, trace: str, packets: int, timeout_s: float, segments: int = SEGMENTS
) -> dict[str, int]:
    """Poll InfluxDB until every segment has `packets` hop_latency points; return the last counts."""
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = segment_counts(influx_url, trace)
        if len(counts) == segments and all(n >= packets for n in counts.values()):
            time.sleep(3)  # a last replay would show as extra points
            return segment_counts(influx_url, trace)
        time.sleep(1)
    return counts


def assert_every_packet_once(influx_url: str, trace: str, packets: int, timeout_s: float) -> None:
    counts = wait_points(influx_url, trace, packets, timeout_s)
    assert len(counts) == SEGMENTS, f"segments in InfluxDB: {counts}"
    assert all(n == packets for n in counts.values()), f"{packets} packets sent, points per segment {counts}"
    distinct = distinct_packets(influx_url, trace)
    assert all(n == packets for n in distinct.values()), f"distinct packet IDs per segment {distinct}"


def test_group_survives_a_killed_collector_and_a_new_one(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], kafka_lab: Callable[..., Any]
) -> None:
    """Three collectors share 6 partitions; one is SIGKILLed mid-stream, a fourth joins: every packet is in
    InfluxDB exactly once per segment (the killed one's uncommitted tail is replayed by the partitions' new
    owners and overwrites itself), every segment complete."""
    trace = f"kafka-kill-{os.urandom(2).hex()}"
    spec, plan_a, plan_b = traced_path(topology, trace)
    lab = kafka_lab(spec, partitions=6)
    collectors = [lab.start_collector() for _ in range(3)]
    for c in collectors:
        c.wait_metric(
            lambda m: m.get("hoptrace_collector_kafka_partitions_assigned", 0) >= 1, 60, "partitions"
        )
    (agent_a, _), (agent_b, _) = start_agents(
        agent_factory, topology, (plan_a, plan_b), lab.broker.bootstrap, lab.topic
    )

    flow = UdpFlow(topology, rate_pps=400).start()
    victim = collectors[1]
    try:  # killed with a committed head and an uncommitted tail
        before_kill = victim.wait_metric(
            lambda m: m.get("hoptrace_collector_kafka_commits_total", 0) >= 1
            and m.get("hoptrace_collector_kafka_uncommitted_messages", 0) > 0,
            30,
            "a commit",
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\nagent host-a:\n{agent_a.stderr_text()[-3000:]}") from None
    victim.kill()
    newcomer = lab.start_collector()
    newcomer.wait_metric(
        lambda m: m.get("hoptrace_collector_kafka_partitions_assigned", 0) >= 1, 60, "partitions"
    )
    time.sleep(2)  # traffic for the newcomer to consume (pacing)
    sent = flow.stop()
    agent_a.stop()
    agent_b.stop()
    tagged = tagged_at_exit(agent_a)
    assert tagged == sent, f"{sent} datagrams sent, {tagged} tagged"

    assert_every_packet_once(lab.influx.url, trace, sent, timeout_s=90)
    survivors = [collectors[0], collectors[2], newcomer]
    owned = [c.metrics_now()["hoptrace_collector_kafka_partitions_assigned"] for c in survivors]
    assert sum(owned) == 6, f"partitions owned by the live collectors: {owned}"
    assert before_kill["hoptrace_collector_kafka_partitions_assigned"] >= 1
    print(
        f"{sent} packets; the victim had consumed "
        f"{before_kill['hoptrace_collector_kafka_messages_total']:.0f} messages, "
        f"{before_kill['hoptrace_collector_kafka_uncommitted_messages']:.0f} not committed"
    )


def test_broker_down_20s_agents_buffer_nothing_lost(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], kafka_lab: Callable[..., Any]
) -> None:
    """The broker killed for ~20 s mid-stream: the agents buffer (their /metrics say so), the collectors keep
    running, and once it is back every packet reaches InfluxDB once."""
    trace = f"kafka-outage-{os.urandom(2).hex()}"
    spec, plan_a, plan_b = traced_path(topology, trace)
    lab = kafka_lab(spec, partitions=4)
    collectors = [lab.start_collector() for _ in range(2)]
    for c in collectors:
        c.wait_metric(
            lambda m: m.get("hoptrace_collector_kafka_partitions_assigned", 0) >= 1, 60, "partitions"
        )
    (agent_a, metrics_a), (agent_b, _) = start_agents(
        agent_factory, topology, (plan_a, plan_b), lab.broker.bootstrap, lab.topic
    )
    flow = UdpFlow(topology, rate_pps=300).start()
    collectors[0].wait_metric(
        lambda m: m.get("hoptrace_collector_kafka_messages_total", 0) >= 10, 30, "consuming"
    )

    lab.broker.stop_process()
    down = time.monotonic()
    deadline = down + 15
    during: dict[str, float] = {}
    while time.monotonic() < deadline:  # the agent says it is holding records
        during = scrape_agent(metrics_a)
        if during.get('hoptrace_agent_connected{peer="kafka"}') == 0 and (
            during.get("hoptrace_agent_kafka_buffered_messages", 0) > 0
        ):
            break
        time.sleep(0.5)
    assert during.get('hoptrace_agent_connected{peer="kafka"}') == 0, during
    assert during["hoptrace_agent_kafka_buffered_messages"] > 0, during
    time.sleep(max(0.0, down + 8 - time.monotonic()))
    lab.broker.restart()  # ~10 s until it serves again: ~20 s without a broker
    outage = time.monotonic() - down
    time.sleep(2)  # traffic after the broker is back (pacing)
    sent = flow.stop()
    agent_a.stop()
    agent_b.stop()
    assert tagged_at_exit(agent_a) == sent
    for c in collectors:
        assert c.proc is not None and c.proc.poll() is None, f"{c.name} died:\n{c.log()[-3000:]}"
    assert_every_packet_once(lab.influx.url, trace, sent, timeout_s=120)
    dropped = [line for line in agent_a.stderr_text().splitlines() if "records lost" in line]
    assert not dropped, dropped
    assert 'hoptrace_agent_records_dropped_total{reason="queue_full"}' in during
    assert during['hoptrace_agent_records_dropped_total{reason="queue_full"}'] == 0
    shown = {
        k: v for k, v in during.items() if k.startswith(("hoptrace_agent_kafka", "hoptrace_agent_queue"))
    }
    print(f"{sent} packets, broker away {outage:.1f} s; agent during: {shown}")


def test_broker_unreachable_at_agent_start_records_wait(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], kafka_lab: Callable[..., Any]
) -> None:
    """Agents started while the broker is down: traffic is traced, records wait in the agent's bounded queue
    (its /metrics: partitions unknown, not connected, queue bytes), and reach InfluxDB once it is up."""
    trace = f"kafka-late-{os.urandom(2).hex()}"
    spec, plan_a, plan_b = traced_path(topology, trace)
    lab = kafka_lab(spec, partitions=2)
    lab.broker.stop_process()
    (agent_a, metrics_a), (agent_b, _) = start_agents(
        agent_factory, topology, (plan_a, plan_b), lab.broker.bootstrap, lab.topic
    )
    flow = UdpFlow(topology, rate_pps=300).start()
    deadline = time.monotonic() + 15
    waiting: dict[str, float] = {}
    while time.monotonic() < deadline:
        waiting = scrape_agent(metrics_a)
        if waiting.get("hoptrace_agent_queue_bytes", 0) > 0:
            break
        time.sleep(0.5)
    assert waiting.get("hoptrace_agent_kafka_partitions") == 0, waiting
    assert waiting.get('hoptrace_agent_connected{peer="kafka"}') == 0, waiting
    assert waiting.get("hoptrace_agent_queue_bytes", 0) > 0, waiting
    lab.broker.restart()
    collector = lab.start_collector()
    collector.wait_metric(lambda m: m.get("hoptrace_collector_kafka_messages_total", 0) > 0, 60, "records")
    sent = flow.stop()
    agent_a.stop()
    agent_b.stop()
    assert tagged_at_exit(agent_a) == sent
    assert_every_packet_once(lab.influx.url, trace, sent, timeout_s=90)
    assert "cannot read the topic's partitions yet" in agent_a.stderr_text()


def scrape_agent(addr: str) -> dict[str, float]:
    """The agent's /metrics, or {} while it does not answer."""
    try:
        return scrape(addr)
    except OSError:
        return {}


def test_foreign_and_malformed_messages_skipped_too_few_partitions_reported(
    kafka_lab: Callable[..., Any],
) -> None:
    """One partition for two collectors: one owns it, the other idles and both say so (metric and log); a
    message without the hoptrace header and one that does not decode are counted and skipped, and the
    partition goes on with the next message."""
    lab = kafka_lab({"name": "kafka-faults", "hops": [{"name": "h0", "node": "n"}]}, partitions=1)
    a, b = lab.start_collector(), lab.start_collector()
    for c in (a, b):
        c.wait_metric(lambda m: m.get("hoptrace_collector_kafka_idle") == 1, 40, "the idle report")
    owner = a if a.metrics_now()["hoptrace_collector_kafka_partitions_assigned"] == 1 else b
    idle = b if owner is a else a
    assert idle.metrics_now()["hoptrace_collector_kafka_partitions_assigned"] == 0
    assert "1 partitions for 2 collectors" in a.log() + b.log()

    header = [("hoptrace-format", b"RecordBatch/v1")]
    lab.broker.produce(lab.topic, b'{"some": "other producer"}', 0)
    lab.broker.produce(lab.topic, b"\xff\xff\xff\x07garbage", 0, header)
    good = records_pb2.RecordBatch(node="n", trace="kafka-faults", batch_seq=1, record_size=32)
    lab.broker.produce(lab.topic, good.SerializeToString(), 0, header)
    m = owner.wait_metric(
        lambda m: m.get("hoptrace_collector_kafka_messages_total", 0) >= 1,
        30,
        "the good message after the bad",
    )
    assert m['hoptrace_collector_kafka_skipped_total{reason="foreign"}'] == 1
    assert m['hoptrace_collector_kafka_skipped_total{reason="malformed"}'] == 1
    assert "Traceback" not in owner.log() + idle.log()


def per_second_counts(influx_url: str, trace: str) -> list[tuple[str, str, int]]:
    """(time, partition window tag, count) of the end_to_end segment_stats windows (diagnostics)."""
    from hoptrace.lab.influx import BUCKET, flux

    rows = flux(
        influx_url,
        f'from(bucket: "{BUCKET}") |> range(start: -1h) '
        f'|> filter(fn: (r) => r._measurement == "segment_stats" and r.trace == "{trace}" '
        f'and r._field == "count" and r.segment == "end_to_end")',
    )
    return [(str(r["_time"]), str(r.get("collector")), int(r["_value"])) for r in rows]


def agents_json(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """`hoptrace agents --json` by node."""
    return {a["node"]: a for a in json.loads(cluster.hoptrace("agents", "--json").stdout)}


def wait_transport(
    cluster: LocalCluster, node: str, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> dict[str, Any]:
    """Poll `hoptrace agents --json` until `node`'s transport satisfies `predicate`; return it."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = agents_json(cluster).get(node, {}).get("transport")
        if last is not None and predicate(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"{node}: {what} not within {timeout_s} s; transport {last}")


def test_broker_down_buffered_records_shown_in_agents_and_metrics(
    topology: TwoHostTopology, kafka_lab: Callable[..., Any]
) -> None:
    """Agents under a dispatcher publish to Kafka; the broker is stopped: `hoptrace agents` shows the
    transport down and the buffered records rising (at least every record of the packets sent since), the
    agent's /metrics the same count; the broker back: the buffer drains to 0, nothing dropped, every packet
    in InfluxDB once."""
    trace = f"kafka-shown-{os.urandom(2).hex()}"
    spec = vxlan_path_spec(topology, trace, port=PORT)
    lab = kafka_lab(json_format.MessageToDict(spec), partitions=2)
    collector = lab.start_collector()
    collector.wait_metric(
        lambda m: m.get("hoptrace_collector_kafka_partitions_assigned") == 2, 60, "partitions"
    )
    hops_a = sum(1 for hop in spec.hops if hop.node == "host-a")

    cluster = LocalCluster(influx_url=lab.influx.url, secure=False)
    try:
        cluster.start_dispatcher()
        cluster.wait_listening(addrs=[cluster.dispatcher_addr])
        kafka = ["--kafka-brokers", lab.broker.bootstrap, "--kafka-topic", lab.topic, "--clock-server", "off"]
        for node, netns in (("host-a", topology.host_a), ("host-b", topology.host_b)):
            cluster.start_agent(node, netns, records_to=kafka)
        cluster.wait_agents(["host-a", "host-b"])
        cluster.apply(spec, timeout_s=120)
        metrics_a = cluster.metrics_addr("agent-host-a")

        flow = UdpFlow(topology, rate_pps=200).start()
        collector.wait_metric(
            lambda m: m.get("hoptrace_collector_kafka_messages_total", 0) >= 10, 30, "records"
        )
        up = wait_transport(cluster, "host-a", lambda t: t["state"] == "up", 15, "transport up")
        assert (up["kind"], up["topic"], up["partitions"]) == ("kafka", lab.topic, 2), up
        assert up["destination"] == lab.broker.bootstrap, up

        lab.broker.stop_process()
        sent_at_down = flow.sent
        time.sleep(3)  # the outage the node's queue holds the records of (the thing tested)
        sent = flow.stop()
        # Every record of the packets sent since the broker stopped waits on the node (and maybe some before).
        held = hops_a * (sent - sent_at_down)
        down = wait_transport(
            cluster,
            "host-a",
            lambda t: not t["connected"] and t["buffered_records"] >= held,
            20,
            f"down with >= {held} buffered records",
        )
        assert down["state"].startswith("down") and down["dropped_records"] == 0, down
        table = cluster.hoptrace("agents", "--wide").stdout
        assert "kafka:" in table and "down" in table and "BUFFERED" in table, table
        shown = scrape_agent(metrics_a)
        assert shown["hoptrace_agent_buffered_records"] >= held, shown
        assert shown['hoptrace_agent_connected{peer="kafka"}'] == 0, shown

        lab.broker.restart()
        drained = wait_transport(
            cluster,
            "host-a",
            lambda t: t["state"] == "up" and t["buffered_records"] == 0,
            90,
            "the buffer drained",
        )
        assert drained["dropped_records"] == 0, drained
        after = scrape_agent(metrics_a)
        assert after["hoptrace_agent_buffered_records"] == 0
        tagged = [v for k, v in after.items() if 'counter="tagged"' in k and 'hop_index="0"' in k]
        assert tagged == [sent], f"{sent} datagrams sent, tagged {tagged}"
        try:
            assert_every_packet_once(lab.influx.url, trace, sent, timeout_s=120)
        except AssertionError:
            print("DIAG distinct", distinct_packets(lab.influx.url, trace))
            print("DIAG collector log", collector.log()[-4000:])
            print("DIAG per second", per_second_counts(lab.influx.url, trace))
            raise
        print(f"{sent} packets; {sent - sent_at_down} sent with the broker away; host-a while down: {down}")
    finally:
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)


def records_consumed(collectors: list[Any]) -> float:
    """Records the live collectors consumed so far (a replayed record again)."""
    total = 0.0
    for c in collectors:
        with contextlib.suppress(OSError):  # a collector just killed or stopped
            metrics = c.metrics_now()
            total += sum(v for k, v in metrics.items() if k.startswith("hoptrace_collector_records_"))
    return total


def test_collectors_started_together_on_a_backlog_rebalanced_while_it_drains(
    kafka_lab: Callable[..., Any],
) -> None:
    """A 4-partition topic already holds a backlog (2-hop trace, 250,000 packets); two collectors start
    together on it, a third joins, the first is SIGKILLed and the second stopped while it drains, so the
    partitions move four times with packets in their joins and their windows half written: every packet is
    counted exactly once in `segment_stats` (per segment, summed over seconds and partitions), and has
    exactly one `hop_latency` point per segment."""
    packets, partitions = 250_000, 4
    trace = f"kafka-backlog-{os.urandom(2).hex()}"
    spec = {"name": trace, "hops": [{"name": "a", "node": "node-a"}, {"name": "b", "node": "node-b"}]}
    lab = kafka_lab(spec, partitions=partitions)
    records = publish_backlog(lab.broker.bootstrap, lab.topic, trace, packets, partitions)
    assert records == 2 * packets
    first, second = lab.start_collector(), lab.start_collector()

    def when_consumed(share: float, live: list[Any]) -> None:
        deadline = time.monotonic() + 120
        while records_consumed(live) < share * records:
            assert time.monotonic() < deadline, f"{share:.0%} of the backlog not consumed: {live}"
            time.sleep(0.2)
        # still draining: the rebalance this precedes happens with the backlog half read
        assert records_consumed(live) < records, "the backlog drained before the rebalance"

    when_consumed(0.05, [first, second])
    third = lab.start_collector()
    third.wait_metric(lambda m: m.get("hoptrace_collector_kafka_partitions_assigned", 0) >= 1, 60, "a share")
    when_consumed(0.25, [first, second, third])
    first.kill()  # its partitions move after the session timeout (3 s), replayed from their commits
    when_consumed(0.45, [second, third])
    assert second.stop() == 0  # a graceful leave: revoked, committed, replayed by the third
    third.wait_metric(
        lambda m: m.get("hoptrace_collector_kafka_partitions_assigned") == partitions, 60, "every partition"
    )

    counts = wait_points(lab.influx.url, trace, packets, timeout_s=90, segments=2)
    try:
        assert len(counts) == 2 and all(n == packets for n in counts.values()), (
            f"{packets} packets in the backlog, segment_stats counts {counts}"
        )
        distinct = distinct_packets(lab.influx.url, trace)
        assert len(distinct) == 2 and all(n == packets for n in distinct.values()), distinct
    except AssertionError:
        print("DIAG per second", per_second_counts(lab.influx.url, trace))
        for c in (first, second, third):
            print(f"DIAG {c.name} log", c.log()[-6000:])
        raise
    metrics = third.metrics_now()
    assert metrics["hoptrace_collector_kafka_uncommitted_messages"] == 0, metrics
    assert metrics["hoptrace_collector_kafka_rebalances_total"] >= 2, metrics
    print(f"{packets} packets published; segment_stats counts {counts}; distinct hop_latency IDs {distinct}")


EVENT_PAYLOAD = 1001  # odd: its wire frame (+92 bytes of outer and inner headers) is unlike any other
EVENT_WIRE_FRAME = EVENT_PAYLOAD + 92
EVENT_PORT = 5555  # not the trace filter's port: the datagrams stay untagged, their size as sent


def test_event_probe_counts_over_kafka_reported_once_across_a_rebalance(
    topology: TwoHostTopology, agent_factory: Callable[..., AgentProcess], kafka_lab: Callable[..., Any]
) -> None:
    """An event probe (host-a's frames of one size leaving wire0, counted by CPU and by a length histogram)
    over Kafka: the agent sends its cumulative values in the heartbeat to every partition, two collectors
    own four partitions, a third joins between two halves of the datagrams and takes over committed
    partitions. The report's count equals the datagrams sent, once: every partition's owner writes the
    same growth lines (InfluxDB keeps one), and a partition's new owner takes the first values it sees
    after the commit as the baseline, not as growth."""
    trace = f"kafka-events-{os.urandom(2).hex()}"
    spec, plan_a, plan_b = traced_path(topology, trace)
    events_spec = spec_from_data(
        {
            "name": trace,
            "hops": [],
            "events": [
                {
                    "name": "wire-frames",
                    "node": "host-a",
                    "tracepoint": "net:net_dev_xmit",
                    "where": f'len == {EVENT_WIRE_FRAME} and rc == 0 and name == "wire0"',
                    "actions": [{"count": {"by": "cpu"}}, {"histogram": "len"}],
                }
            ],
        }
    )
    plan_a["events"] = [json_format.MessageToDict(event_attach(events_spec.events[0], 0, events_spec))]
    lab = kafka_lab(spec, partitions=4)
    collectors = [lab.start_collector() for _ in range(2)]
    for c in collectors:
        c.wait_metric(lambda m: m.get("hoptrace_collector_kafka_partitions_assigned") == 2, 60, "two each")
    (agent_a, _), (agent_b, _) = start_agents(
        agent_factory, topology, (plan_a, plan_b), lab.broker.bootstrap, lab.topic
    )
    half = 75

    def send(n: int) -> None:
        payloads = [os.urandom(EVENT_PAYLOAD) for _ in range(n)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, EVENT_PORT, 0.002) == payloads

    send(half)
    for c in collectors:  # the partitions that move next have commits (and heartbeats after them)
        c.wait_metric(lambda m: m.get("hoptrace_collector_kafka_commits_total", 0) >= 2, 30, "commits")
    newcomer = lab.start_collector()
    newcomer.wait_metric(
        lambda m: m.get("hoptrace_collector_kafka_partitions_assigned", 0) >= 1, 60, "a share"
    )
    send(half)
    sent = 2 * half

    deadline = time.monotonic() + 40
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:  # the values come with the heartbeats, every second
        found = reported_event(lab.influx.url, trace, "wire-frames")
        if found.get("count", 0) >= sent:
            break
        time.sleep(1)
    time.sleep(3)  # more heartbeats: a second count of the same growth would show now
    agent_a.stop()
    agent_b.stop()
    found = reported_event(lab.influx.url, trace, "wire-frames")
    assert (found.get("node"), found.get("count"), found.get("count_by")) == ("host-a", sent, "cpu"), found
    assert sum(found["by"].values()) == sent, found
    assert found["histogram"] == [{"le": 2047, "count": sent}], found  # 1093 bytes: bucket [1024, 2047]
    assert newcomer.metrics_now()["hoptrace_collector_kafka_partitions_assigned"] >= 1


def reported_event(influx_url: str, trace: str, name: str) -> dict[str, Any]:
    """One event of a trace as the report shows it (`hoptrace report --json`'s events), {} if none."""
    events = report_from_proto(read_report(trace, url=influx_url, bucket=BUCKET, since="1h"))["events"]
    found = [e for e in events if e["name"] == name]
    assert len(found) <= 1, events
    return found[0] if found else {}
