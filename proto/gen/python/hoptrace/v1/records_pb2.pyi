import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordBatch(_message.Message):
    __slots__ = ("node", "trace", "generation", "batch_seq", "records", "record_size", "counters", "agent_dropped", "clock", "watermark_ns")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SEQ_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    RECORD_SIZE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    AGENT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_NS_FIELD_NUMBER: _ClassVar[int]
    node: str
    trace: str
    generation: int
    batch_seq: int
    records: bytes
    record_size: int
    counters: _containers.RepeatedCompositeFieldContainer[HopCounters]
    agent_dropped: int
    clock: NodeClock
    watermark_ns: int
    def __init__(self, node: _Optional[str] = ..., trace: _Optional[str] = ..., generation: _Optional[int] = ..., batch_seq: _Optional[int] = ..., records: _Optional[bytes] = ..., record_size: _Optional[int] = ..., counters: _Optional[_Iterable[_Union[HopCounters, _Mapping]]] = ..., agent_dropped: _Optional[int] = ..., clock: _Optional[_Union[NodeClock, _Mapping]] = ..., watermark_ns: _Optional[int] = ...) -> None: ...

class HopCounters(_message.Message):
    __slots__ = ("hop_index", "hop", "at", "seen", "matched", "recorded", "tagged", "untagged", "too_big", "gso_skipped", "not_matched", "parse_truncated", "parse_malformed", "parse_non_ip", "ringbuf_full", "bytes", "tag_failed")
    HOP_INDEX_FIELD_NUMBER: _ClassVar[int]
    HOP_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    TAGGED_FIELD_NUMBER: _ClassVar[int]
    UNTAGGED_FIELD_NUMBER: _ClassVar[int]
    TOO_BIG_FIELD_NUMBER: _ClassVar[int]
    GSO_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    NOT_MATCHED_FIELD_NUMBER: _ClassVar[int]
    PARSE_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PARSE_MALFORMED_FIELD_NUMBER: _ClassVar[int]
    PARSE_NON_IP_FIELD_NUMBER: _ClassVar[int]
    RINGBUF_FULL_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TAG_FAILED_FIELD_NUMBER: _ClassVar[int]
    hop_index: int
    hop: str
    at: _timestamp_pb2.Timestamp
    seen: int
    matched: int
    recorded: int
    tagged: int
    untagged: int
    too_big: int
    gso_skipped: int
    not_matched: int
    parse_truncated: int
    parse_malformed: int
    parse_non_ip: int
    ringbuf_full: int
    bytes: int
    tag_failed: int
    def __init__(self, hop_index: _Optional[int] = ..., hop: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seen: _Optional[int] = ..., matched: _Optional[int] = ..., recorded: _Optional[int] = ..., tagged: _Optional[int] = ..., untagged: _Optional[int] = ..., too_big: _Optional[int] = ..., gso_skipped: _Optional[int] = ..., not_matched: _Optional[int] = ..., parse_truncated: _Optional[int] = ..., parse_malformed: _Optional[int] = ..., parse_non_ip: _Optional[int] = ..., ringbuf_full: _Optional[int] = ..., bytes: _Optional[int] = ..., tag_failed: _Optional[int] = ...) -> None: ...

class NodeClock(_message.Message):
    __slots__ = ("monotonic_to_realtime_ns", "offset_ns", "bound_ns", "drift_ppm", "delay_ns", "sampled_at_ns")
    MONOTONIC_TO_REALTIME_NS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    BOUND_NS_FIELD_NUMBER: _ClassVar[int]
    DRIFT_PPM_FIELD_NUMBER: _ClassVar[int]
    DELAY_NS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    monotonic_to_realtime_ns: int
    offset_ns: int
    bound_ns: int
    drift_ppm: float
    delay_ns: int
    sampled_at_ns: int
    def __init__(self, monotonic_to_realtime_ns: _Optional[int] = ..., offset_ns: _Optional[int] = ..., bound_ns: _Optional[int] = ..., drift_ppm: _Optional[float] = ..., delay_ns: _Optional[int] = ..., sampled_at_ns: _Optional[int] = ...) -> None: ...

class StreamSummary(_message.Message):
    __slots__ = ("batches", "records")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    batches: int
    records: int
    def __init__(self, batches: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...
