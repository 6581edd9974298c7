"""Python mirror of `struct hoptrace_record` and decoding of `RecordBatch.records`.

The C header `kernel-patch/include/hoptrace.h` is the one definition; `tests/collector/test_records.py`
compares this layout with the BTF of `kernel-patch/build/hoptrace.bpf.o` so the two cannot drift.

Records are decoded into plain tuples (`struct.iter_unpack`), the cheapest Python object per record, in the
field order of `RECORD_FIELDS`.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hoptrace.v1 import records_pb2

# struct hoptrace_record: ts_ns u64, packet_id u32, flow_hash u32, ifindex u32, wire_len u32,
# hop_index u16, trace_slot u16, cpu u16, flags u16. Little-endian, 32 bytes, no padding.
RECORD_FORMAT = "<QIIIIHHHH"
RECORD_STRUCT = struct.Struct(RECORD_FORMAT)
RECORD_SIZE = RECORD_STRUCT.size
RECORD_FIELDS: tuple[str, ...] = (
    "ts_ns",
    "packet_id",
    "flow_hash",
    "ifindex",
    "wire_len",
    "hop_index",
    "trace_slot",
    "cpu",
    "flags",
)

# Tuple positions, for readers that index records.
TS_NS, PACKET_ID, FLOW_HASH, IFINDEX, WIRE_LEN, HOP_INDEX, TRACE_SLOT, CPU, FLAGS = range(len(RECORD_FIELDS))

# Packet IDs: origin node salt in the top 8 bits, a per-trace sequence in the low 24 (HOPTRACE_ID_SEQ_BITS).
ID_SEQ_BITS = 24
ID_SEQ_MASK = (1 << ID_SEQ_BITS) - 1

Record = tuple[int, int, int, int, int, int, int, int, int]

# Bytes hoptrace adds to a tagged packet (hoptrace.h): the UDP ID in the surplus area, the TCP option.
HOPTRACE_UDP_ID_LEN = 4
HOPTRACE_TCPOPT_LEN = 8


class RecordFlag(enum.IntFlag):
    """`enum hoptrace_record_flag`."""

    IPV6 = 1 << 0
    TCP = 1 << 1
    UDP = 1 << 2
    ENCAP_VXLAN = 1 << 3
    ENCAP_GENEVE = 1 << 4
    TAGGED_HERE = 1 << 5
    VLAN = 1 << 6


class Counter(enum.IntEnum):
    """`enum hoptrace_counter`: index of each per-hop counter."""

    SEEN = 0
    MATCHED = 1
    RECORDED = 2
    TAGGED = 3
    UNTAGGED = 4
    TOO_BIG = 5
    GSO_SKIPPED = 6
    NOT_MATCHED = 7
    PARSE_TRUNCATED = 8
    PARSE_MALFORMED = 9
    PARSE_NON_IP = 10
    RINGBUF_FULL = 11
    BYTES = 12
    TAG_FAILED = 13
    MAX = 14


class RecordDecodeError(ValueError):
    """The packed records of a batch do not fit the record size."""


def origin_of(packet_id: int) -> int:
    """Return the origin node salt of a packet ID (its top 8 bits)."""
    return packet_id >> ID_SEQ_BITS


def pack_records(records: Iterable[Record]) -> bytes:
    """Pack record tuples (in `RECORD_FIELDS` order) into the wire form of `RecordBatch.records`."""
    pack = RECORD_STRUCT.pack
    return b"".join(pack(*r) for r in records)


def decode_records(data: bytes, record_size: int = RECORD_SIZE) -> Iterator[Record]:
    """Decode packed records into tuples without copying the buffer.

    `record_size` 0 means the current size (32). A larger size (a newer agent appending fields) is accepted:
    only the known 32-byte prefix of each record is read. A smaller size, or a length that is not a multiple
    of the size, raises `RecordDecodeError`.
    """
    size = record_size or RECORD_SIZE
    if size < RECORD_SIZE:
        raise RecordDecodeError(f"record_size {size} is smaller than struct hoptrace_record ({RECORD_SIZE})")
    if len(data) % size:
        raise RecordDecodeError(f"{len(data)} bytes of records is not a multiple of record_size {size}")
    if size == RECORD_SIZE:
        return RECORD_STRUCT.iter_unpack(data)
    view = memoryview(data)
    unpack_from = RECORD_STRUCT.unpack_from
    return (unpack_from(view, off) for off in range(0, len(data), size))


@dataclass(slots=True)
class DecodedBatch:
    """One `RecordBatch` after decoding: its identity, records as tuples, counters and clock."""

    node: str
    trace: str
    generation: int = 0
    batch_seq: int = 0
    records: list[Record] = field(default_factory=list)
    counters: list[records_pb2.HopCounters] = field(default_factory=list)
    clock: records_pb2.NodeClock | None = None
    agent_dropped: int = 0
    watermark_ns: int = 0  # node CLOCK_MONOTONIC: every record not sent yet is at least this recent


def decode_batch(batch: records_pb2.RecordBatch) -> DecodedBatch:
    """Decode a `RecordBatch` message; raises `RecordDecodeError` on a malformed records field."""
    return DecodedBatch(
        node=batch.node,
        trace=batch.trace,
        generation=batch.generation,
        batch_seq=batch.batch_seq,
        records=list(decode_records(batch.records, batch.record_size)),
        counters=list(batch.counters),
        clock=batch.clock if batch.HasField("clock") else None,
        agent_dropped=batch.agent_dropped,
        watermark_ns=batch.watermark_ns,
    )
