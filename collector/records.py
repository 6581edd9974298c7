"""Python mirror of `struct hoptrace_record` and decoding of `RecordBatch.records`.

The C header `kernel-patch/include/hoptrace.h` is the one definition; `hoptrace.kernel_abi` is generated
from the object's BTF (`make vocab`), and `tests/collector/test_records.py` compares it with the BTF again.

Records are decoded into plain tuples (`struct.iter_unpack`), the cheapest Python object per record, in the
field order of `RECORD_FIELDS`.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from hoptrace import kernel_abi
from hoptrace.v1 import records_pb2

RECORD_FORMAT = kernel_abi.RECORD_FORMAT
RECORD_STRUCT = struct.Struct(RECORD_FORMAT)
RECORD_SIZE = RECORD_STRUCT.size
RECORD_FIELDS: tuple[str, ...] = kernel_abi.RECORD_FIELDS
# struct hoptrace_values: the record action's fields and values, after each record with VALUES set.
VALUES_STRUCT = struct.Struct(kernel_abi.VALUES_FORMAT)
VALUES_SIZE = kernel_abi.VALUES_SIZE
VALUES_MAX = kernel_abi.VALUES_MAX
assert VALUES_STRUCT.size == VALUES_SIZE, "kernel_abi.VALUES_FORMAT disagrees with the BTF's size"
# struct hoptrace_addresses: the 5-tuple a hop saw, after each record (and its values) with ADDRESSES set.
ADDRESSES_STRUCT = struct.Struct(kernel_abi.ADDRESSES_FORMAT)
ADDRESSES_SIZE = kernel_abi.ADDRESSES_SIZE
assert ADDRESSES_STRUCT.size == ADDRESSES_SIZE, "kernel_abi.ADDRESSES_FORMAT disagrees with the BTF's size"
# struct hoptrace_capture: a packet's first bytes at a hop, after each record (its values, addresses) with
# CAPTURE set (the capture action).
CAPTURE_STRUCT = struct.Struct(kernel_abi.CAPTURE_FORMAT)
CAPTURE_SIZE = kernel_abi.CAPTURE_SIZE
CAPTURE_MAX = kernel_abi.CAPTURE_MAX
assert CAPTURE_STRUCT.size == CAPTURE_SIZE, "kernel_abi.CAPTURE_FORMAT disagrees with the BTF's size"

# Tuple positions, for readers that index records.
TS_NS, PACKET_ID, FLOW_HASH, IFINDEX, WIRE_LEN, HOP_INDEX, TRACE_SLOT, CPU, FLAGS = range(len(RECORD_FIELDS))

# Packet IDs: the trace's origin in the top 8 bits, a per-trace sequence in the low bits.
ID_SEQ_BITS = kernel_abi.ID_SEQ_BITS
ID_SEQ_MASK = kernel_abi.ID_SEQ_MASK

Record = tuple[int, int, int, int, int, int, int, int, int]
# One traced packet's recorded values at one hop: (record, {field number: value}).
RecordedValues = tuple[Record, dict[int, int]]

# The kernel function a drop hop's record names (the drop_function field): the agent writes an ID
# (RecordBatch.functions names it), 0 when it could not name the kernel's address (no kallsyms).
DROP_FUNCTION = kernel_abi.FIELDS.index("drop_function")
UNKNOWN_FUNCTION = "unknown"

# Bytes hoptrace adds to a tagged packet (hoptrace.h): the UDP ID in the surplus area, the TCP option.
HOPTRACE_UDP_ID_LEN = kernel_abi.UDP_ID_LEN
HOPTRACE_TCPOPT_LEN = kernel_abi.TCPOPT_LEN

RecordFlag = enum.IntFlag("RecordFlag", kernel_abi.RECORD_FLAGS)
RecordFlag.__doc__ = "`enum hoptrace_record_flag`."
# The flags tested per record, as plain ints: `int & RecordFlag.X` builds an enum member every time (it was
# a fifth of the Kafka collector's profile).
F_TCP, F_UDP, F_VALUES = int(RecordFlag.TCP), int(RecordFlag.UDP), int(RecordFlag.VALUES)
F_ADDRESSES = int(RecordFlag.ADDRESSES)
F_CAPTURE = int(RecordFlag.CAPTURE)
PROTOCOLS = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp"}

Counter = enum.IntEnum("Counter", {name.upper(): index for index, name in enumerate(kernel_abi.COUNTERS)})
Counter.__doc__ = "`enum hoptrace_counter`: index of each per-hop counter in `HopCounters.values`."


class RecordDecodeError(ValueError):
    """The packed records of a batch do not fit the record size."""


def origin_of(packet_id: int) -> int:
    """Return the origin of a packet ID (its top 8 bits: the trace's, given by the dispatcher)."""
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


def decode_values(records: list[Record], data: bytes, value_size: int = VALUES_SIZE) -> list[RecordedValues]:
    """Pair each record that has VALUES in its flags with its struct hoptrace_values, in order.

    Raises `RecordDecodeError` when the values do not match the records that announce them.
    """
    with_values = [r for r in records if r[FLAGS] & F_VALUES]
    if not with_values and not data:
        return []
    size = value_size or VALUES_SIZE
    if size < VALUES_SIZE or len(data) != size * len(with_values):
        raise RecordDecodeError(
            f"{len(data)} bytes of values for {len(with_values)} records with values (value_size {size})"
        )
    out: list[RecordedValues] = []
    for i, rec in enumerate(with_values):
        *fields, count, v0, v1, v2, v3 = VALUES_STRUCT.unpack_from(data, i * size)
        count = min(count, VALUES_MAX)
        values = (v0, v1, v2, v3)
        out.append((rec, {fields[j]: values[j] for j in range(count) if fields[j]}))
    return out


@dataclass(frozen=True, slots=True)
class FiveTuple:
    """The innermost 5-tuple one hop saw (`struct hoptrace_addresses`)."""

    protocol: int
    source: str  # address
    source_port: int
    destination: str
    destination_port: int

    @property
    def protocol_name(self) -> str:
        return PROTOCOLS.get(self.protocol, str(self.protocol))

    def endpoint(self, side: str, with_port: bool = True) -> str:
        """`side` ("source" or "destination") as "address:port" ("[v6]:port"), or the address alone."""
        if side == "source":
            address, port = self.source, self.source_port
        else:
            address, port = self.destination, self.destination_port
        if not with_port:
            return address
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


# One packet's addresses at one hop: (record, what the hop saw).
DescribedRecord = tuple[Record, FiveTuple]


def decode_addresses(records: list[Record], data: bytes, size: int = ADDRESSES_SIZE) -> list[DescribedRecord]:
    """Pair each record that has ADDRESSES in its flags with its struct hoptrace_addresses, in order.

    Raises `RecordDecodeError` when the addresses do not match the records that announce them."""
    if not data:  # heartbeats, batches without a describing packet: no pass over their records
        return []
    described = [r for r in records if r[FLAGS] & F_ADDRESSES]
    size = size or ADDRESSES_SIZE
    if size < ADDRESSES_SIZE or len(data) != size * len(described):
        raise RecordDecodeError(
            f"{len(data)} bytes of addresses for {len(described)} records with addresses"
            f" (addresses_size {size})"
        )
    out: list[DescribedRecord] = []
    for i, rec in enumerate(described):
        saddr, daddr, sport, dport, proto, family = ADDRESSES_STRUCT.unpack_from(data, i * size)
        if family == 4:
            src, dst = str(ipaddress.IPv4Address(saddr[:4])), str(ipaddress.IPv4Address(daddr[:4]))
        elif family == 6:
            src, dst = str(ipaddress.IPv6Address(saddr)), str(ipaddress.IPv6Address(daddr))
        else:
            raise RecordDecodeError(f"addresses of packet {rec[PACKET_ID]:#x}: family {family}")
        out.append((rec, FiveTuple(proto, src, sport, dst, dport)))
    return out


@dataclass(frozen=True, slots=True)
class Capture:
    """A packet's first bytes as one hop saw them (`struct hoptrace_capture`)."""

    wire_len: int  # the packet's length from data[0] on
    link_type: int  # pcap's LINKTYPE_* of data[0]: kernel_abi.CAPTURE_LINK_ETHERNET or _RAW (IP)
    data: bytes  # the captured bytes (at most CAPTURE_MAX)


# One packet's bytes at one hop: (record, its capture).
CapturedRecord = tuple[Record, Capture]


def decode_captures(records: list[Record], data: bytes, size: int = CAPTURE_SIZE) -> list[CapturedRecord]:
    """Pair each record that has CAPTURE in its flags with its struct hoptrace_capture, in order.

    Raises `RecordDecodeError` when the captures do not match the records that announce them, or one says
    it holds more bytes than it has."""
    captured = [r for r in records if r[FLAGS] & F_CAPTURE]
    if not captured and not data:
        return []
    size = size or CAPTURE_SIZE
    if size < CAPTURE_SIZE or len(data) != size * len(captured):
        raise RecordDecodeError(
            f"{len(data)} bytes of captures for {len(captured)} records with captures (capture_size {size})"
        )
    out: list[CapturedRecord] = []
    for i, rec in enumerate(captured):
        wire_len, length, link_type, raw = CAPTURE_STRUCT.unpack_from(data, i * size)
        if length > CAPTURE_MAX:
            raise RecordDecodeError(
                f"capture of packet {rec[PACKET_ID]:#x}: {length} bytes, at most {CAPTURE_MAX}"
            )
        out.append((rec, Capture(wire_len, link_type, raw[:length])))
    return out


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
    events: list[records_pb2.EventValues] = field(default_factory=list)  # event probes, cumulative
    values: list[RecordedValues] = field(default_factory=list)  # the record action's, per packet
    addresses: list[DescribedRecord] = field(default_factory=list)  # what hops saw, one packet in 64
    captures: list[CapturedRecord] = field(default_factory=list)  # the capture action's bytes, per packet
    functions: dict[int, str] = field(default_factory=dict)  # the kernel functions `values` name, by ID


def decode_batch(batch: records_pb2.RecordBatch) -> DecodedBatch:
    """Decode a `RecordBatch` message; raises `RecordDecodeError` on a malformed records field."""
    records = list(decode_records(batch.records, batch.record_size))
    return DecodedBatch(
        node=batch.node,
        trace=batch.trace,
        generation=batch.generation,
        batch_seq=batch.batch_seq,
        records=records,
        values=decode_values(records, batch.values, batch.value_size),
        addresses=decode_addresses(records, batch.addresses, batch.addresses_size),
        captures=decode_captures(records, batch.captures, batch.capture_size),
        functions=dict(batch.functions) if batch.functions else {},
        counters=list(batch.counters),
        clock=batch.clock if batch.HasField("clock") else None,
        agent_dropped=batch.agent_dropped,
        watermark_ns=batch.watermark_ns,
        events=list(batch.events),
    )


def function_name(values: Mapping[int, int], functions: Mapping[int, str]) -> str:
    """The kernel function one record's values name (drop_function: where the kernel freed the packet), by
    the names its batch carries: "unknown" for 0 or an ID the batch does not name, "" without the field (an
    older agent's record)."""
    value = values.get(DROP_FUNCTION)
    if value is None:
        return ""
    return functions.get(value, UNKNOWN_FUNCTION) if value else UNKNOWN_FUNCTION


def hop_counters(hop_index: int, hop: str, **values: int) -> records_pb2.HopCounters:
    """A `HopCounters` with the named counters set (names of `kernel_abi.COUNTERS`), the others 0."""
    unknown = set(values) - set(kernel_abi.COUNTERS)
    if unknown:
        raise ValueError(f"unknown counters {sorted(unknown)}; known: {', '.join(kernel_abi.COUNTERS)}")
    return records_pb2.HopCounters(
        hop_index=hop_index, hop=hop, values=[values.get(name, 0) for name in kernel_abi.COUNTERS]
    )


def counters_by_name(counters: records_pb2.HopCounters) -> dict[str, int]:
    """Each counter of `counters` by its name (an older agent's missing ones are 0)."""
    values = list(counters.values)
    return {name: values[i] if i < len(values) else 0 for i, name in enumerate(kernel_abi.COUNTERS)}
