"""Synthetic records and batches for the collector tests (packed with the collector's own struct format)."""

from __future__ import annotations

from pathlib import Path

from hoptrace.collector.records import RECORD_SIZE, Record, pack_records
from hoptrace.v1 import records_pb2

ROOT = Path(__file__).resolve().parents[2]
BPF_OBJ = ROOT / "kernel-patch" / "build" / "hoptrace.bpf.o"
SALT = 7  # origin node salt used for packet IDs


def pid(seq: int, salt: int = SALT) -> int:
    """A packet ID: origin salt in the top 8 bits, sequence in the low 24."""
    return (salt << 24) | seq


def rec(ts: int, packet_id: int, hop: int, flow: int = 0xABCD, wire_len: int = 100, flags: int = 0) -> Record:
    """One record tuple in RECORD_FIELDS order."""
    return (ts, packet_id, flow, 3, wire_len, hop, 1, 0, flags)


def batch(
    node: str,
    trace: str,
    records: list[Record],
    seq: int = 1,
    clock_delta: int | None = None,
    counters: list[records_pb2.HopCounters] | None = None,
) -> records_pb2.RecordBatch:
    """A RecordBatch message; `clock_delta` sets NodeClock.monotonic_to_realtime_ns (offset 0)."""
    msg = records_pb2.RecordBatch(
        node=node,
        trace=trace,
        generation=1,
        batch_seq=seq,
        records=pack_records(records),
        record_size=RECORD_SIZE,
        counters=counters or [],
    )
    if clock_delta is not None:
        msg.clock.monotonic_to_realtime_ns = clock_delta
    return msg
