"""receiver.py: the gRPC Collector service, with agents that reconnect."""

from __future__ import annotations

import grpc
import pytest
from collector_helpers import batch, pid, rec

from hoptrace.collector.receiver import CollectorReceiver, ReceiverConfig, start_receiver
from hoptrace.collector.records import DecodedBatch
from hoptrace.v1 import records_pb2, records_pb2_grpc

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


def test_stream_records_counts_per_node_across_reconnects() -> None:
    got: list[DecodedBatch] = []
    receiver = CollectorReceiver(got.append)
    server, port = start_receiver(receiver, ReceiverConfig(listen="127.0.0.1:0"))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)
            first = [batch("n1", "t", [rec(i, pid(i + 1), 0) for i in range(10)], seq=s) for s in (1, 2, 4)]
            summary = stub.StreamRecords(iter(first))
            assert (summary.batches, summary.records) == (3, 30)
            # the agent reconnects and resends seq 1 (already consumed: dropped), then goes on with seq 5
            bad = records_pb2.RecordBatch(
                node="n1", trace="t", batch_seq=6, records=b"\0" * 33, record_size=32
            )
            resent = batch("n1", "t", [rec(i, pid(i + 1), 0) for i in range(10)], seq=1)
            second = [resent, batch("n1", "t", [rec(1, pid(1), 1)], seq=5), bad, batch("n2", "t", [], seq=3)]
            summary = stub.StreamRecords(iter(second))
            assert (summary.batches, summary.records) == (2, 1)
    finally:
        server.stop(None)
    assert [b.node for b in got] == ["n1", "n1", "n1", "n1", "n2"]
    assert got[0].records[3] == rec(3, pid(4), 0)
    stats = receiver.stats_snapshot()
    n1 = stats["n1"]
    assert (n1.streams, n1.active_streams, n1.batches, n1.records) == (2, 0, 4, 31)
    # seq 2 -> 4 skips one; the resent seq 1 is a duplicate; the 33-byte batch does not decode
    assert (n1.seq_gaps, n1.duplicates, n1.decode_errors) == (1, 1, 1)
    assert stats["n2"].batches == 1


def test_an_oversized_message_is_refused_and_the_receiver_goes_on() -> None:
    """One 60 MiB batch once raised RSS by 1.4 GB. Past 4 MiB (128x an agent's largest
    batch), gRPC refuses the message before it is decoded."""
    got: list[DecodedBatch] = []
    server, port = start_receiver(CollectorReceiver(got.append), ReceiverConfig(listen="127.0.0.1:0"))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = records_pb2_grpc.CollectorStub(ch)
            huge = records_pb2.RecordBatch(node="n1", trace="t", batch_seq=1, records=b"\0" * (5 << 20))
            try:
                stub.StreamRecords(iter([huge]))
                raise AssertionError("a 5 MiB message was accepted")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            summary = stub.StreamRecords(iter([batch("n1", "t", [rec(1, pid(1), 0)], seq=2)]))
            assert (summary.batches, summary.records) == (1, 1)
    finally:
        server.stop(None)
    assert [len(b.records) for b in got] == [1]
