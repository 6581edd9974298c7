"""Receive stage: the gRPC `hoptrace.v1.Collector` service.

Agents stream `RecordBatch`es (`StreamRecords`); each batch is decoded and handed to the pipeline's consumer.
Agents reconnect at will and then resend the batches the broken stream may have lost, with their original
`batch_seq` (one sequence per agent across all its traces, starting at the agent's start time, so a restarted
agent never reuses a number). The receiver therefore drops a batch whose (node, batch_seq) it has already
consumed, and counts a gap when a node's sequence skips ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from hoptrace.collector.records import DecodedBatch, RecordDecodeError, decode_batch
from hoptrace.common.grpcutil import (
    STREAM_RECORDS_METHOD,
    AgentIdentityInterceptor,
    TLSFiles,
    batch_node,
    insecure_warning,
    server_credentials,
)
from hoptrace.common.revocation import revocation_interceptors
from hoptrace.v1 import records_pb2, records_pb2_grpc

log = logging.getLogger(__name__)


@dataclass
class ReceiverConfig:
    """Where the receiver listens; with `tls`, only agents with a certificate of `tls.ca` may stream, each
    only for the node its certificate names (None: plaintext, anyone, with a WARNING)."""

    listen: str = "127.0.0.1:7071"
    # An agent's batch is at most 1,024 records (32 KiB) and its counters; this leaves 100x headroom and
    # bounds what one hostile message costs (60 MiB raised RSS by 1.4 GB and held the pipeline 36 s).
    max_message_bytes: int = 4 << 20
    max_workers: int = 32
    tls: TLSFiles | None = None

    def validate(self) -> None:
        """Raise ValueError on an unusable setting."""
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"listen address must be HOST:PORT, got {self.listen!r}")
        if self.max_message_bytes < 1024 or self.max_workers < 1:
            raise ValueError("max_message_bytes >= 1024 and max_workers >= 1")


class SeenBatches:
    """The last `capacity` batch_seqs consumed from one node: enough to recognise any resend (the agent
    resends at most the batches its last stream had in flight)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._order: deque[int] = deque()
        self._seen: set[int] = set()
        self.highest = -1

    def add(self, seq: int) -> tuple[bool, int]:
        """Record `seq`; returns (is_new, batches skipped before it)."""
        if seq in self._seen:
            return False, 0
        skipped = seq - self.highest - 1 if self.highest >= 0 and seq > self.highest + 1 else 0
        self.highest = max(self.highest, seq)
        self._seen.add(seq)
        self._order.append(seq)
        if len(self._order) > self.capacity:
            self._seen.discard(self._order.popleft())
        return True, skipped


@dataclass
class NodeStats:
    """What the receiver saw from one node."""

    streams: int = 0
    active_streams: int = 0
    batches: int = 0
    records: int = 0
    seq_gaps: int = 0
    duplicates: int = 0  # resent batches already consumed
    decode_errors: int = 0
    agent_dropped: int = 0  # latest value reported (cumulative since the agent started)
    last_batch_unix_ns: int = 0
    traces: set[str] = field(default_factory=set)


class CollectorReceiver(records_pb2_grpc.CollectorServicer):
    """`Collector` service: decodes batches and passes them to `consume`."""

    def __init__(self, consume: Callable[[DecodedBatch], None]) -> None:
        self._consume = consume
        self._lock = threading.Lock()
        self.nodes: dict[str, NodeStats] = {}
        self._seen: dict[str, SeenBatches] = {}

    def _node(self, node: str) -> NodeStats:
        with self._lock:
            st = self.nodes.get(node)
            if st is None:
                st = self.nodes[node] = NodeStats()
            return st

    def stats_snapshot(self) -> dict[str, NodeStats]:
        """A copy of the per-node counters."""
        with self._lock:
            return {k: NodeStats(**{**vars(v), "traces": set(v.traces)}) for k, v in self.nodes.items()}

    def StreamRecords(  # noqa: N802 - gRPC method name
        self, request_iterator: Iterator[records_pb2.RecordBatch], context: grpc.ServicerContext
    ) -> records_pb2.StreamSummary:
        """Consume one agent stream until it ends; answer with what this stream delivered."""
        batches = records = 0
        stream_node: NodeStats | None = (
            None  # an agent streams as one node; counters follow each batch's node
        )
        try:
            for msg in request_iterator:
                node_stats = self._node(msg.node)
                if stream_node is None:
                    stream_node = node_stats
                    with self._lock:
                        node_stats.streams += 1
                        node_stats.active_streams += 1
                try:
                    batch = decode_batch(msg)
                except RecordDecodeError as err:
                    with self._lock:
                        node_stats.decode_errors += 1
                    log.warning("node %s trace %s: bad batch %d: %s", msg.node, msg.trace, msg.batch_seq, err)
                    continue
                with self._lock:
                    is_new, gap = self._seen.setdefault(msg.node, SeenBatches()).add(msg.batch_seq)
                    if not is_new:
                        node_stats.duplicates += 1
                if not is_new:
                    continue
                self._consume(batch)
                batches += 1
                records += len(batch.records)
                with self._lock:
                    node_stats.batches += 1
                    node_stats.records += len(batch.records)
                    node_stats.seq_gaps += gap
                    node_stats.agent_dropped = msg.agent_dropped
                    node_stats.last_batch_unix_ns = time.time_ns()
                    node_stats.traces.add(msg.trace)
        finally:
            if stream_node is not None:
                with self._lock:
                    stream_node.active_streams -= 1
        return records_pb2.StreamSummary(batches=batches, records=records)


def start_receiver(
    receiver: CollectorReceiver,
    config: ReceiverConfig,
    add_services: Callable[[grpc.Server], None] | None = None,
) -> tuple[grpc.Server, int]:
    """Start a gRPC server serving `receiver` (and what `add_services` adds beside it, e.g. the clock keys);
    return it and the bound port (useful with port 0)."""
    config.validate()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="collector-rpc"),
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
        interceptors=[
            *revocation_interceptors(config.tls.crl, config.tls.ca),
            AgentIdentityInterceptor({STREAM_RECORDS_METHOD: batch_node}),
        ]
        if config.tls
        else [],
    )
    records_pb2_grpc.add_CollectorServicer_to_server(receiver, server)
    if add_services is not None:
        add_services(server)
    if config.tls is None:
        log.warning(insecure_warning("collector", config.listen))
        port = server.add_insecure_port(config.listen)
    else:
        port = server.add_secure_port(config.listen, server_credentials(config.tls))
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}")
    server.start()
    return server, port
