import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from hoptrace.v1 import agent_pb2 as _agent_pb2
from hoptrace.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FieldError(_message.Message):
    __slots__ = ("field", "reason")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    field: str
    reason: str
    def __init__(self, field: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ValidateTraceRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _trace_pb2.TraceSpec
    def __init__(self, spec: _Optional[_Union[_trace_pb2.TraceSpec, _Mapping]] = ...) -> None: ...

class ValidateTraceResponse(_message.Message):
    __slots__ = ("errors",)
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.RepeatedCompositeFieldContainer[FieldError]
    def __init__(self, errors: _Optional[_Iterable[_Union[FieldError, _Mapping]]] = ...) -> None: ...

class ApplyTraceRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _trace_pb2.TraceSpec
    def __init__(self, spec: _Optional[_Union[_trace_pb2.TraceSpec, _Mapping]] = ...) -> None: ...

class Trace(_message.Message):
    __slots__ = ("spec", "generation", "applied_at", "nodes")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_AT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    spec: _trace_pb2.TraceSpec
    generation: int
    applied_at: _timestamp_pb2.Timestamp
    nodes: _containers.RepeatedCompositeFieldContainer[_agent_pb2.TraceStatus]
    def __init__(self, spec: _Optional[_Union[_trace_pb2.TraceSpec, _Mapping]] = ..., generation: _Optional[int] = ..., applied_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[_agent_pb2.TraceStatus, _Mapping]]] = ...) -> None: ...

class ListTracesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTracesResponse(_message.Message):
    __slots__ = ("traces",)
    TRACES_FIELD_NUMBER: _ClassVar[int]
    traces: _containers.RepeatedCompositeFieldContainer[Trace]
    def __init__(self, traces: _Optional[_Iterable[_Union[Trace, _Mapping]]] = ...) -> None: ...

class GetTraceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTraceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTraceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[Agent]
    def __init__(self, agents: _Optional[_Iterable[_Union[Agent, _Mapping]]] = ...) -> None: ...

class GetAgentRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class Agent(_message.Message):
    __slots__ = ("registration", "connected", "last_heartbeat", "clock", "lost_records", "transport")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    LOST_RECORDS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    registration: _agent_pb2.Register
    connected: bool
    last_heartbeat: _timestamp_pb2.Timestamp
    clock: NodeClockStatus
    lost_records: int
    transport: _agent_pb2.TransportStatus
    def __init__(self, registration: _Optional[_Union[_agent_pb2.Register, _Mapping]] = ..., connected: bool = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., clock: _Optional[_Union[NodeClockStatus, _Mapping]] = ..., lost_records: _Optional[int] = ..., transport: _Optional[_Union[_agent_pb2.TransportStatus, _Mapping]] = ...) -> None: ...

class NodeClockStatus(_message.Message):
    __slots__ = ("offset_ns", "bound_ns", "drift_ppm", "measured", "measured_at", "delay_ns", "last_jump")
    OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    BOUND_NS_FIELD_NUMBER: _ClassVar[int]
    DRIFT_PPM_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_JUMP_FIELD_NUMBER: _ClassVar[int]
    offset_ns: int
    bound_ns: int
    drift_ppm: float
    measured: bool
    measured_at: _timestamp_pb2.Timestamp
    delay_ns: int
    last_jump: ClockJump
    def __init__(self, offset_ns: _Optional[int] = ..., bound_ns: _Optional[int] = ..., drift_ppm: _Optional[float] = ..., measured: bool = ..., measured_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay_ns: _Optional[int] = ..., last_jump: _Optional[_Union[ClockJump, _Mapping]] = ...) -> None: ...

class ClockJump(_message.Message):
    __slots__ = ("node", "jump_ns", "allowed_ns", "at", "segments")
    NODE_FIELD_NUMBER: _ClassVar[int]
    JUMP_NS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_NS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    node: str
    jump_ns: int
    allowed_ns: int
    at: _timestamp_pb2.Timestamp
    segments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., jump_ns: _Optional[int] = ..., allowed_ns: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., segments: _Optional[_Iterable[str]] = ...) -> None: ...

class GetReportRequest(_message.Message):
    __slots__ = ("trace", "start", "end", "with_series")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    WITH_SERIES_FIELD_NUMBER: _ClassVar[int]
    trace: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    with_series: bool
    def __init__(self, trace: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., with_series: bool = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("trace", "packets", "complete", "segments", "end_to_end", "hops", "series", "events", "addresses", "translations", "clock_jumps")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    END_TO_END_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    TRANSLATIONS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_JUMPS_FIELD_NUMBER: _ClassVar[int]
    trace: str
    packets: int
    complete: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStats]
    end_to_end: SegmentStats
    hops: _containers.RepeatedCompositeFieldContainer[HopThroughput]
    series: _containers.RepeatedCompositeFieldContainer[SegmentSeries]
    events: _containers.RepeatedCompositeFieldContainer[EventResult]
    addresses: _containers.RepeatedCompositeFieldContainer[HopAddresses]
    translations: _containers.RepeatedCompositeFieldContainer[AddressTranslation]
    clock_jumps: _containers.RepeatedCompositeFieldContainer[ClockJump]
    def __init__(self, trace: _Optional[str] = ..., packets: _Optional[int] = ..., complete: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentStats, _Mapping]]] = ..., end_to_end: _Optional[_Union[SegmentStats, _Mapping]] = ..., hops: _Optional[_Iterable[_Union[HopThroughput, _Mapping]]] = ..., series: _Optional[_Iterable[_Union[SegmentSeries, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[EventResult, _Mapping]]] = ..., addresses: _Optional[_Iterable[_Union[HopAddresses, _Mapping]]] = ..., translations: _Optional[_Iterable[_Union[AddressTranslation, _Mapping]]] = ..., clock_jumps: _Optional[_Iterable[_Union[ClockJump, _Mapping]]] = ...) -> None: ...

class HopAddresses(_message.Message):
    __slots__ = ("hop", "protocol", "source", "destination", "packets")
    HOP_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    hop: str
    protocol: str
    source: str
    destination: str
    packets: int
    def __init__(self, hop: _Optional[str] = ..., protocol: _Optional[str] = ..., source: _Optional[str] = ..., destination: _Optional[str] = ..., packets: _Optional[int] = ...) -> None: ...

class AddressTranslation(_message.Message):
    __slots__ = ("from_hop", "to_hop", "kind", "before", "after", "packets")
    FROM_HOP_FIELD_NUMBER: _ClassVar[int]
    TO_HOP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    from_hop: str
    to_hop: str
    kind: str
    before: str
    after: str
    packets: int
    def __init__(self, from_hop: _Optional[str] = ..., to_hop: _Optional[str] = ..., kind: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ..., packets: _Optional[int] = ...) -> None: ...

class EventResult(_message.Message):
    __slots__ = ("name", "node", "count", "count_by", "by", "histogram_arg", "histogram", "latency_missed", "recorded")
    class ByEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    COUNT_BY_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_ARG_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MISSED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    name: str
    node: str
    count: int
    count_by: str
    by: _containers.ScalarMap[str, int]
    histogram_arg: str
    histogram: _containers.RepeatedCompositeFieldContainer[HistogramBucket]
    latency_missed: int
    recorded: _containers.RepeatedCompositeFieldContainer[EventRecordedResult]
    def __init__(self, name: _Optional[str] = ..., node: _Optional[str] = ..., count: _Optional[int] = ..., count_by: _Optional[str] = ..., by: _Optional[_Mapping[str, int]] = ..., histogram_arg: _Optional[str] = ..., histogram: _Optional[_Iterable[_Union[HistogramBucket, _Mapping]]] = ..., latency_missed: _Optional[int] = ..., recorded: _Optional[_Iterable[_Union[EventRecordedResult, _Mapping]]] = ...) -> None: ...

class EventRecordedResult(_message.Message):
    __slots__ = ("arg", "count", "sum", "mean", "min", "max", "last", "signed")
    ARG_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    arg: str
    count: int
    sum: float
    mean: float
    min: int
    max: int
    last: int
    signed: bool
    def __init__(self, arg: _Optional[str] = ..., count: _Optional[int] = ..., sum: _Optional[float] = ..., mean: _Optional[float] = ..., min: _Optional[int] = ..., max: _Optional[int] = ..., last: _Optional[int] = ..., signed: bool = ...) -> None: ...

class SegmentSeries(_message.Message):
    __slots__ = ("segment", "p50", "p99")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    segment: str
    p50: _containers.RepeatedCompositeFieldContainer[SeriesPoint]
    p99: _containers.RepeatedCompositeFieldContainer[SeriesPoint]
    def __init__(self, segment: _Optional[str] = ..., p50: _Optional[_Iterable[_Union[SeriesPoint, _Mapping]]] = ..., p99: _Optional[_Iterable[_Union[SeriesPoint, _Mapping]]] = ...) -> None: ...

class SeriesPoint(_message.Message):
    __slots__ = ("at", "ns")
    AT_FIELD_NUMBER: _ClassVar[int]
    NS_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    ns: float
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ns: _Optional[float] = ...) -> None: ...

class SegmentStats(_message.Message):
    __slots__ = ("to", "count", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "incomplete", "loss_count", "loss_rate", "jitter_ns", "jitter_p99_ns", "at", "below_clock_bound", "tracer_lost", "same_node", "clock_bound_ns", "before_attach", "drops")
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_NS_FIELD_NUMBER: _ClassVar[int]
    P50_NS_FIELD_NUMBER: _ClassVar[int]
    P90_NS_FIELD_NUMBER: _ClassVar[int]
    P99_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_NS_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    LOSS_COUNT_FIELD_NUMBER: _ClassVar[int]
    LOSS_RATE_FIELD_NUMBER: _ClassVar[int]
    JITTER_NS_FIELD_NUMBER: _ClassVar[int]
    JITTER_P99_NS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    BELOW_CLOCK_BOUND_FIELD_NUMBER: _ClassVar[int]
    TRACER_LOST_FIELD_NUMBER: _ClassVar[int]
    SAME_NODE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_BOUND_NS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_ATTACH_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    to: str
    count: int
    mean_ns: float
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int
    incomplete: int
    loss_count: int
    loss_rate: float
    jitter_ns: float
    jitter_p99_ns: float
    at: _timestamp_pb2.Timestamp
    below_clock_bound: bool
    tracer_lost: int
    same_node: bool
    clock_bound_ns: int
    before_attach: int
    drops: _containers.RepeatedCompositeFieldContainer[DropCount]
    def __init__(self, to: _Optional[str] = ..., count: _Optional[int] = ..., mean_ns: _Optional[float] = ..., p50_ns: _Optional[int] = ..., p90_ns: _Optional[int] = ..., p99_ns: _Optional[int] = ..., max_ns: _Optional[int] = ..., incomplete: _Optional[int] = ..., loss_count: _Optional[int] = ..., loss_rate: _Optional[float] = ..., jitter_ns: _Optional[float] = ..., jitter_p99_ns: _Optional[float] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., below_clock_bound: bool = ..., tracer_lost: _Optional[int] = ..., same_node: bool = ..., clock_bound_ns: _Optional[int] = ..., before_attach: _Optional[int] = ..., drops: _Optional[_Iterable[_Union[DropCount, _Mapping]]] = ..., **kwargs) -> None: ...

class DropCount(_message.Message):
    __slots__ = ("node", "reason", "count", "function")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    count: int
    function: str
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ..., count: _Optional[int] = ..., function: _Optional[str] = ...) -> None: ...

class HopThroughput(_message.Message):
    __slots__ = ("hop", "packets_per_s", "bytes_per_s", "counts", "histograms", "recorded", "container", "pod")
    HOP_FIELD_NUMBER: _ClassVar[int]
    PACKETS_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAMS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    hop: str
    packets_per_s: float
    bytes_per_s: float
    counts: _containers.RepeatedCompositeFieldContainer[HopCount]
    histograms: _containers.RepeatedCompositeFieldContainer[HopHistogram]
    recorded: _containers.RepeatedCompositeFieldContainer[HopRecorded]
    container: str
    pod: str
    def __init__(self, hop: _Optional[str] = ..., packets_per_s: _Optional[float] = ..., bytes_per_s: _Optional[float] = ..., counts: _Optional[_Iterable[_Union[HopCount, _Mapping]]] = ..., histograms: _Optional[_Iterable[_Union[HopHistogram, _Mapping]]] = ..., recorded: _Optional[_Iterable[_Union[HopRecorded, _Mapping]]] = ..., container: _Optional[str] = ..., pod: _Optional[str] = ...) -> None: ...

class HopRecorded(_message.Message):
    __slots__ = ("node", "field", "count", "min", "max", "mean", "last")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    node: str
    field: str
    count: int
    min: int
    max: int
    mean: float
    last: int
    def __init__(self, node: _Optional[str] = ..., field: _Optional[str] = ..., count: _Optional[int] = ..., min: _Optional[int] = ..., max: _Optional[int] = ..., mean: _Optional[float] = ..., last: _Optional[int] = ...) -> None: ...

class HopCount(_message.Message):
    __slots__ = ("node", "by", "key", "count", "key_name")
    NODE_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    KEY_NAME_FIELD_NUMBER: _ClassVar[int]
    node: str
    by: str
    key: int
    count: int
    key_name: str
    def __init__(self, node: _Optional[str] = ..., by: _Optional[str] = ..., key: _Optional[int] = ..., count: _Optional[int] = ..., key_name: _Optional[str] = ...) -> None: ...

class HopHistogram(_message.Message):
    __slots__ = ("node", "field", "total", "buckets")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    node: str
    field: str
    total: int
    buckets: _containers.RepeatedCompositeFieldContainer[HistogramBucket]
    def __init__(self, node: _Optional[str] = ..., field: _Optional[str] = ..., total: _Optional[int] = ..., buckets: _Optional[_Iterable[_Union[HistogramBucket, _Mapping]]] = ...) -> None: ...

class HistogramBucket(_message.Message):
    __slots__ = ("le", "count")
    LE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    le: int
    count: int
    def __init__(self, le: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class WatchSegmentStatsRequest(_message.Message):
    __slots__ = ("trace",)
    TRACE_FIELD_NUMBER: _ClassVar[int]
    trace: str
    def __init__(self, trace: _Optional[str] = ...) -> None: ...

class WatchSpecsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpecSet(_message.Message):
    __slots__ = ("specs",)
    SPECS_FIELD_NUMBER: _ClassVar[int]
    specs: _containers.RepeatedCompositeFieldContainer[_trace_pb2.TraceSpec]
    def __init__(self, specs: _Optional[_Iterable[_Union[_trace_pb2.TraceSpec, _Mapping]]] = ...) -> None: ...

class GetPacketsRequest(_message.Message):
    __slots__ = ("trace", "start", "end", "packet_id", "slowest", "captured")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PACKET_ID_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_FIELD_NUMBER: _ClassVar[int]
    CAPTURED_FIELD_NUMBER: _ClassVar[int]
    trace: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    packet_id: int
    slowest: int
    captured: int
    def __init__(self, trace: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., packet_id: _Optional[int] = ..., slowest: _Optional[int] = ..., captured: _Optional[int] = ...) -> None: ...

class PacketList(_message.Message):
    __slots__ = ("packets", "truncated", "capture_hops")
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_HOPS_FIELD_NUMBER: _ClassVar[int]
    packets: _containers.RepeatedCompositeFieldContainer[PacketTimeline]
    truncated: bool
    capture_hops: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, packets: _Optional[_Iterable[_Union[PacketTimeline, _Mapping]]] = ..., truncated: bool = ..., capture_hops: _Optional[_Iterable[str]] = ...) -> None: ...

class PacketTimeline(_message.Message):
    __slots__ = ("packet_id", "at", "end_to_end_ns", "segments", "captures")
    PACKET_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    END_TO_END_NS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CAPTURES_FIELD_NUMBER: _ClassVar[int]
    packet_id: int
    at: _timestamp_pb2.Timestamp
    end_to_end_ns: int
    segments: _containers.RepeatedCompositeFieldContainer[PacketSegment]
    captures: _containers.RepeatedCompositeFieldContainer[PacketCapture]
    def __init__(self, packet_id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_to_end_ns: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[PacketSegment, _Mapping]]] = ..., captures: _Optional[_Iterable[_Union[PacketCapture, _Mapping]]] = ...) -> None: ...

class PacketCapture(_message.Message):
    __slots__ = ("hop", "node", "at", "wire_len", "link_type", "data")
    HOP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    WIRE_LEN_FIELD_NUMBER: _ClassVar[int]
    LINK_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    hop: str
    node: str
    at: _timestamp_pb2.Timestamp
    wire_len: int
    link_type: int
    data: bytes
    def __init__(self, hop: _Optional[str] = ..., node: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., wire_len: _Optional[int] = ..., link_type: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PacketSegment(_message.Message):
    __slots__ = ("to", "offset_ns", "latency_ns", "below_clock_bound", "from_node", "to_node")
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_NS_FIELD_NUMBER: _ClassVar[int]
    BELOW_CLOCK_BOUND_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    to: str
    offset_ns: int
    latency_ns: int
    below_clock_bound: bool
    from_node: str
    to_node: str
    def __init__(self, to: _Optional[str] = ..., offset_ns: _Optional[int] = ..., latency_ns: _Optional[int] = ..., below_clock_bound: bool = ..., from_node: _Optional[str] = ..., to_node: _Optional[str] = ..., **kwargs) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Version(_message.Message):
    __slots__ = ("dispatcher", "api")
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    dispatcher: str
    api: str
    def __init__(self, dispatcher: _Optional[str] = ..., api: _Optional[str] = ...) -> None: ...

class RunPresetRequest(_message.Message):
    __slots__ = ("node", "preset", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    node: str
    preset: str
    args: _containers.ScalarMap[str, str]
    def __init__(self, node: _Optional[str] = ..., preset: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DiscoverRequest(_message.Message):
    __slots__ = ("filter", "nodes", "duration_ms", "packets", "name")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    filter: _trace_pb2.Filter
    nodes: _containers.RepeatedScalarFieldContainer[str]
    duration_ms: int
    packets: int
    name: str
    def __init__(self, filter: _Optional[_Union[_trace_pb2.Filter, _Mapping]] = ..., nodes: _Optional[_Iterable[str]] = ..., duration_ms: _Optional[int] = ..., packets: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class DiscoverEvent(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: DiscoverProgress
    result: DiscoverResult
    def __init__(self, progress: _Optional[_Union[DiscoverProgress, _Mapping]] = ..., result: _Optional[_Union[DiscoverResult, _Mapping]] = ...) -> None: ...

class DiscoverProgress(_message.Message):
    __slots__ = ("message", "node", "packets", "nodes_pending")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    NODES_PENDING_FIELD_NUMBER: _ClassVar[int]
    message: str
    node: str
    packets: int
    nodes_pending: int
    def __init__(self, message: _Optional[str] = ..., node: _Optional[str] = ..., packets: _Optional[int] = ..., nodes_pending: _Optional[int] = ...) -> None: ...

class DiscoveredPath(_message.Message):
    __slots__ = ("packets", "share", "hops", "since_first_ns")
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIRST_NS_FIELD_NUMBER: _ClassVar[int]
    packets: int
    share: float
    hops: _containers.RepeatedCompositeFieldContainer[_trace_pb2.HopSpec]
    since_first_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, packets: _Optional[int] = ..., share: _Optional[float] = ..., hops: _Optional[_Iterable[_Union[_trace_pb2.HopSpec, _Mapping]]] = ..., since_first_ns: _Optional[_Iterable[int]] = ...) -> None: ...

class DiscoverResult(_message.Message):
    __slots__ = ("spec", "paths", "packets", "nodes", "message", "segments")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    spec: _trace_pb2.TraceSpec
    paths: _containers.RepeatedCompositeFieldContainer[DiscoveredPath]
    packets: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    message: str
    segments: _containers.RepeatedCompositeFieldContainer[DiscoveredSegment]
    def __init__(self, spec: _Optional[_Union[_trace_pb2.TraceSpec, _Mapping]] = ..., paths: _Optional[_Iterable[_Union[DiscoveredPath, _Mapping]]] = ..., packets: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[DiscoveredSegment, _Mapping]]] = ...) -> None: ...

class DiscoveredSegment(_message.Message):
    __slots__ = ("from_hop", "to_hop", "packets", "share", "median_ns", "p99_ns", "translated")
    FROM_HOP_FIELD_NUMBER: _ClassVar[int]
    TO_HOP_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_NS_FIELD_NUMBER: _ClassVar[int]
    P99_NS_FIELD_NUMBER: _ClassVar[int]
    TRANSLATED_FIELD_NUMBER: _ClassVar[int]
    from_hop: _trace_pb2.HopSpec
    to_hop: _trace_pb2.HopSpec
    packets: int
    share: float
    median_ns: int
    p99_ns: int
    translated: bool
    def __init__(self, from_hop: _Optional[_Union[_trace_pb2.HopSpec, _Mapping]] = ..., to_hop: _Optional[_Union[_trace_pb2.HopSpec, _Mapping]] = ..., packets: _Optional[int] = ..., share: _Optional[float] = ..., median_ns: _Optional[int] = ..., p99_ns: _Optional[int] = ..., translated: bool = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("limit", "trace")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    limit: int
    trace: str
    def __init__(self, limit: _Optional[int] = ..., trace: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("at", "action", "token", "token_role", "certificate", "certificate_role", "on_behalf_of", "peer", "trace", "generation", "preset", "nodes", "outcome", "error")
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ROLE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_ROLE_FIELD_NUMBER: _ClassVar[int]
    ON_BEHALF_OF_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    action: str
    token: str
    token_role: str
    certificate: str
    certificate_role: str
    on_behalf_of: str
    peer: str
    trace: str
    generation: int
    preset: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    outcome: str
    error: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[str] = ..., token: _Optional[str] = ..., token_role: _Optional[str] = ..., certificate: _Optional[str] = ..., certificate_role: _Optional[str] = ..., on_behalf_of: _Optional[str] = ..., peer: _Optional[str] = ..., trace: _Optional[str] = ..., generation: _Optional[int] = ..., preset: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., outcome: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...
