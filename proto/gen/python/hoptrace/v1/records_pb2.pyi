import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from hoptrace.v1 import counters_pb2 as _counters_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordBatch(_message.Message):
    __slots__ = ("node", "trace", "generation", "batch_seq", "records", "record_size", "counters", "agent_dropped", "clock", "watermark_ns", "events", "values", "value_size", "addresses", "addresses_size", "captures", "capture_size", "functions")
    class FunctionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
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
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_SIZE_FIELD_NUMBER: _ClassVar[int]
    CAPTURES_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_SIZE_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
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
    events: _containers.RepeatedCompositeFieldContainer[EventValues]
    values: bytes
    value_size: int
    addresses: bytes
    addresses_size: int
    captures: bytes
    capture_size: int
    functions: _containers.ScalarMap[int, str]
    def __init__(self, node: _Optional[str] = ..., trace: _Optional[str] = ..., generation: _Optional[int] = ..., batch_seq: _Optional[int] = ..., records: _Optional[bytes] = ..., record_size: _Optional[int] = ..., counters: _Optional[_Iterable[_Union[HopCounters, _Mapping]]] = ..., agent_dropped: _Optional[int] = ..., clock: _Optional[_Union[NodeClock, _Mapping]] = ..., watermark_ns: _Optional[int] = ..., events: _Optional[_Iterable[_Union[EventValues, _Mapping]]] = ..., values: _Optional[bytes] = ..., value_size: _Optional[int] = ..., addresses: _Optional[bytes] = ..., addresses_size: _Optional[int] = ..., captures: _Optional[bytes] = ..., capture_size: _Optional[int] = ..., functions: _Optional[_Mapping[int, str]] = ...) -> None: ...

class EventValues(_message.Message):
    __slots__ = ("event_index", "event", "at", "count_by", "counts", "count", "histogram", "buckets", "seen", "matched", "recorded", "latency_missed")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    COUNT_BY_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MISSED_FIELD_NUMBER: _ClassVar[int]
    event_index: int
    event: str
    at: _timestamp_pb2.Timestamp
    count_by: str
    counts: _containers.ScalarMap[int, int]
    count: bool
    histogram: str
    buckets: _containers.RepeatedScalarFieldContainer[int]
    seen: int
    matched: int
    recorded: _containers.RepeatedCompositeFieldContainer[EventRecorded]
    latency_missed: int
    def __init__(self, event_index: _Optional[int] = ..., event: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., count_by: _Optional[str] = ..., counts: _Optional[_Mapping[int, int]] = ..., count: bool = ..., histogram: _Optional[str] = ..., buckets: _Optional[_Iterable[int]] = ..., seen: _Optional[int] = ..., matched: _Optional[int] = ..., recorded: _Optional[_Iterable[_Union[EventRecorded, _Mapping]]] = ..., latency_missed: _Optional[int] = ...) -> None: ...

class EventRecorded(_message.Message):
    __slots__ = ("arg", "count", "sum", "min", "max", "last", "signed")
    ARG_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    arg: str
    count: int
    sum: float
    min: int
    max: int
    last: int
    signed: bool
    def __init__(self, arg: _Optional[str] = ..., count: _Optional[int] = ..., sum: _Optional[float] = ..., min: _Optional[int] = ..., max: _Optional[int] = ..., last: _Optional[int] = ..., signed: bool = ...) -> None: ...

class HopCounters(_message.Message):
    __slots__ = ("hop_index", "hop", "at", "values", "actions", "attached_ns")
    HOP_INDEX_FIELD_NUMBER: _ClassVar[int]
    HOP_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_NS_FIELD_NUMBER: _ClassVar[int]
    hop_index: int
    hop: str
    at: _timestamp_pb2.Timestamp
    values: _containers.RepeatedScalarFieldContainer[int]
    actions: HopActionValues
    attached_ns: int
    def __init__(self, hop_index: _Optional[int] = ..., hop: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., values: _Optional[_Iterable[int]] = ..., actions: _Optional[_Union[HopActionValues, _Mapping]] = ..., attached_ns: _Optional[int] = ...) -> None: ...

class HopActionValues(_message.Message):
    __slots__ = ("count", "count_by", "counts", "histogram", "buckets")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    COUNT_BY_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    count: bool
    count_by: _counters_pb2.Field
    counts: _containers.ScalarMap[int, int]
    histogram: _counters_pb2.Field
    buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, count: bool = ..., count_by: _Optional[_Union[_counters_pb2.Field, str]] = ..., counts: _Optional[_Mapping[int, int]] = ..., histogram: _Optional[_Union[_counters_pb2.Field, str]] = ..., buckets: _Optional[_Iterable[int]] = ...) -> None: ...

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
