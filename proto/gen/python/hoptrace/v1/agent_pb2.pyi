import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from hoptrace.v1 import counters_pb2 as _counters_pb2
from hoptrace.v1 import trace_pb2 as _trace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "trace_status", "preset_result")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TRACE_STATUS_FIELD_NUMBER: _ClassVar[int]
    PRESET_RESULT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    trace_status: TraceStatus
    preset_result: PresetResult
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., trace_status: _Optional[_Union[TraceStatus, _Mapping]] = ..., preset_result: _Optional[_Union[PresetResult, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node", "kernel_release", "agent_version", "capabilities", "namespaces", "running", "runtime")
    NODE_FIELD_NUMBER: _ClassVar[int]
    KERNEL_RELEASE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    node: str
    kernel_release: str
    agent_version: str
    capabilities: Capabilities
    namespaces: _containers.RepeatedCompositeFieldContainer[Namespace]
    running: _containers.RepeatedCompositeFieldContainer[TraceStatus]
    runtime: ContainerRuntime
    def __init__(self, node: _Optional[str] = ..., kernel_release: _Optional[str] = ..., agent_version: _Optional[str] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., namespaces: _Optional[_Iterable[_Union[Namespace, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[TraceStatus, _Mapping]]] = ..., runtime: _Optional[_Union[ContainerRuntime, _Mapping]] = ...) -> None: ...

class Namespace(_message.Message):
    __slots__ = ("name", "inode", "devices", "workloads")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    name: str
    inode: int
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    workloads: _containers.RepeatedCompositeFieldContainer[_trace_pb2.Workload]
    def __init__(self, name: _Optional[str] = ..., inode: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., workloads: _Optional[_Iterable[_Union[_trace_pb2.Workload, _Mapping]]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("name", "ifindex", "mtu", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IFINDEX_FIELD_NUMBER: _ClassVar[int]
    MTU_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    ifindex: int
    mtu: int
    kind: str
    def __init__(self, name: _Optional[str] = ..., ifindex: _Optional[int] = ..., mtu: _Optional[int] = ..., kind: _Optional[str] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("btf", "ring_buffer", "tcp_header_options", "attach", "action_fields", "unavailable_fields", "drop_reasons")
    class AttachEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttachSupport
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttachSupport, _Mapping]] = ...) -> None: ...
    class UnavailableFieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class DropReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    BTF_FIELD_NUMBER: _ClassVar[int]
    RING_BUFFER_FIELD_NUMBER: _ClassVar[int]
    TCP_HEADER_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELDS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELDS_FIELD_NUMBER: _ClassVar[int]
    DROP_REASONS_FIELD_NUMBER: _ClassVar[int]
    btf: bool
    ring_buffer: bool
    tcp_header_options: bool
    attach: _containers.MessageMap[str, AttachSupport]
    action_fields: _containers.RepeatedScalarFieldContainer[_counters_pb2.Field]
    unavailable_fields: _containers.ScalarMap[str, str]
    drop_reasons: _containers.ScalarMap[int, str]
    def __init__(self, btf: bool = ..., ring_buffer: bool = ..., tcp_header_options: bool = ..., attach: _Optional[_Mapping[str, AttachSupport]] = ..., action_fields: _Optional[_Iterable[_Union[_counters_pb2.Field, str]]] = ..., unavailable_fields: _Optional[_Mapping[str, str]] = ..., drop_reasons: _Optional[_Mapping[int, str]] = ...) -> None: ...

class AttachSupport(_message.Message):
    __slots__ = ("supported", "reason")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    reason: str
    def __init__(self, supported: bool = ..., reason: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_at", "inventory", "transport")
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    sent_at: _timestamp_pb2.Timestamp
    inventory: Inventory
    transport: TransportStatus
    def __init__(self, sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., transport: _Optional[_Union[TransportStatus, _Mapping]] = ...) -> None: ...

class TransportStatus(_message.Message):
    __slots__ = ("kind", "destination", "topic", "connected", "buffered_records", "buffered_bytes", "buffer_capacity_bytes", "dropped_records", "partitions")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUFFER_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    destination: str
    topic: str
    connected: bool
    buffered_records: int
    buffered_bytes: int
    buffer_capacity_bytes: int
    dropped_records: int
    partitions: int
    def __init__(self, kind: _Optional[str] = ..., destination: _Optional[str] = ..., topic: _Optional[str] = ..., connected: bool = ..., buffered_records: _Optional[int] = ..., buffered_bytes: _Optional[int] = ..., buffer_capacity_bytes: _Optional[int] = ..., dropped_records: _Optional[int] = ..., partitions: _Optional[int] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("namespaces", "runtime")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[Namespace]
    runtime: ContainerRuntime
    def __init__(self, namespaces: _Optional[_Iterable[_Union[Namespace, _Mapping]]] = ..., runtime: _Optional[_Union[ContainerRuntime, _Mapping]] = ...) -> None: ...

class ContainerRuntime(_message.Message):
    __slots__ = ("endpoint", "version", "error")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    version: str
    error: str
    def __init__(self, endpoint: _Optional[str] = ..., version: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class TraceStatus(_message.Message):
    __slots__ = ("trace", "generation", "active", "hops", "error", "events", "not_kept")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NOT_KEPT_FIELD_NUMBER: _ClassVar[int]
    trace: str
    generation: int
    active: bool
    hops: _containers.RepeatedCompositeFieldContainer[HopStatus]
    error: str
    events: _containers.RepeatedCompositeFieldContainer[EventStatus]
    not_kept: str
    def __init__(self, trace: _Optional[str] = ..., generation: _Optional[int] = ..., active: bool = ..., hops: _Optional[_Iterable[_Union[HopStatus, _Mapping]]] = ..., error: _Optional[str] = ..., events: _Optional[_Iterable[_Union[EventStatus, _Mapping]]] = ..., not_kept: _Optional[str] = ...) -> None: ...

class EventStatus(_message.Message):
    __slots__ = ("event_index", "name", "attached", "error", "not_kept")
    EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NOT_KEPT_FIELD_NUMBER: _ClassVar[int]
    event_index: int
    name: str
    attached: bool
    error: str
    not_kept: str
    def __init__(self, event_index: _Optional[int] = ..., name: _Optional[str] = ..., attached: bool = ..., error: _Optional[str] = ..., not_kept: _Optional[str] = ...) -> None: ...

class HopStatus(_message.Message):
    __slots__ = ("hop_index", "name", "attached", "error", "refused_actions", "not_kept")
    HOP_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REFUSED_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    NOT_KEPT_FIELD_NUMBER: _ClassVar[int]
    hop_index: int
    name: str
    attached: bool
    error: str
    refused_actions: HopActions
    not_kept: str
    def __init__(self, hop_index: _Optional[int] = ..., name: _Optional[str] = ..., attached: bool = ..., error: _Optional[str] = ..., refused_actions: _Optional[_Union[HopActions, _Mapping]] = ..., not_kept: _Optional[str] = ...) -> None: ...

class DispatcherMessage(_message.Message):
    __slots__ = ("apply", "remove", "run_preset", "signed")
    APPLY_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    RUN_PRESET_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    apply: TracePlan
    remove: RemoveTrace
    run_preset: RunPreset
    signed: SignedMessage
    def __init__(self, apply: _Optional[_Union[TracePlan, _Mapping]] = ..., remove: _Optional[_Union[RemoveTrace, _Mapping]] = ..., run_preset: _Optional[_Union[RunPreset, _Mapping]] = ..., signed: _Optional[_Union[SignedMessage, _Mapping]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("sequence", "signed_at", "expires_at", "apply", "remove", "run_preset")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    APPLY_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    RUN_PRESET_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    signed_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    apply: TracePlan
    remove: RemoveTrace
    run_preset: RunPreset
    def __init__(self, sequence: _Optional[int] = ..., signed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., apply: _Optional[_Union[TracePlan, _Mapping]] = ..., remove: _Optional[_Union[RemoveTrace, _Mapping]] = ..., run_preset: _Optional[_Union[RunPreset, _Mapping]] = ...) -> None: ...

class SignedMessage(_message.Message):
    __slots__ = ("payload", "node", "signature", "signer_cert")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNER_CERT_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    node: str
    signature: bytes
    signer_cert: bytes
    def __init__(self, payload: _Optional[bytes] = ..., node: _Optional[str] = ..., signature: _Optional[bytes] = ..., signer_cert: _Optional[bytes] = ...) -> None: ...

class TracePlan(_message.Message):
    __slots__ = ("trace", "generation", "object", "object_path", "match", "sample", "hops", "tcp_tagging", "events", "id_origin")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    OBJECT_PATH_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    TCP_TAGGING_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ID_ORIGIN_FIELD_NUMBER: _ClassVar[int]
    trace: str
    generation: int
    object: bytes
    object_path: str
    match: FlowMatch
    sample: int
    hops: _containers.RepeatedCompositeFieldContainer[HopAttach]
    tcp_tagging: TcpTagging
    events: _containers.RepeatedCompositeFieldContainer[EventAttach]
    id_origin: int
    def __init__(self, trace: _Optional[str] = ..., generation: _Optional[int] = ..., object: _Optional[bytes] = ..., object_path: _Optional[str] = ..., match: _Optional[_Union[FlowMatch, _Mapping]] = ..., sample: _Optional[int] = ..., hops: _Optional[_Iterable[_Union[HopAttach, _Mapping]]] = ..., tcp_tagging: _Optional[_Union[TcpTagging, _Mapping]] = ..., events: _Optional[_Iterable[_Union[EventAttach, _Mapping]]] = ..., id_origin: _Optional[int] = ...) -> None: ...

class FlowMatch(_message.Message):
    __slots__ = ("ip_proto", "family", "src_addr", "src_mask", "dst_addr", "dst_mask", "src_port", "dst_port")
    IP_PROTO_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    SRC_ADDR_FIELD_NUMBER: _ClassVar[int]
    SRC_MASK_FIELD_NUMBER: _ClassVar[int]
    DST_ADDR_FIELD_NUMBER: _ClassVar[int]
    DST_MASK_FIELD_NUMBER: _ClassVar[int]
    SRC_PORT_FIELD_NUMBER: _ClassVar[int]
    DST_PORT_FIELD_NUMBER: _ClassVar[int]
    ip_proto: int
    family: int
    src_addr: bytes
    src_mask: bytes
    dst_addr: bytes
    dst_mask: bytes
    src_port: int
    dst_port: int
    def __init__(self, ip_proto: _Optional[int] = ..., family: _Optional[int] = ..., src_addr: _Optional[bytes] = ..., src_mask: _Optional[bytes] = ..., dst_addr: _Optional[bytes] = ..., dst_mask: _Optional[bytes] = ..., src_port: _Optional[int] = ..., dst_port: _Optional[int] = ...) -> None: ...

class HopAttach(_message.Message):
    __slots__ = ("hop_index", "name", "kind", "tracepoint_group", "tracepoint_event", "function", "binary", "program", "dev", "netns", "cgroup", "tag_udp", "actions")
    HOP_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRACEPOINT_GROUP_FIELD_NUMBER: _ClassVar[int]
    TRACEPOINT_EVENT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    DEV_FIELD_NUMBER: _ClassVar[int]
    NETNS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    TAG_UDP_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    hop_index: int
    name: str
    kind: _trace_pb2.AttachKind
    tracepoint_group: str
    tracepoint_event: str
    function: str
    binary: str
    program: str
    dev: str
    netns: str
    cgroup: str
    tag_udp: bool
    actions: HopActions
    def __init__(self, hop_index: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[_trace_pb2.AttachKind, str]] = ..., tracepoint_group: _Optional[str] = ..., tracepoint_event: _Optional[str] = ..., function: _Optional[str] = ..., binary: _Optional[str] = ..., program: _Optional[str] = ..., dev: _Optional[str] = ..., netns: _Optional[str] = ..., cgroup: _Optional[str] = ..., tag_udp: bool = ..., actions: _Optional[_Union[HopActions, _Mapping]] = ...) -> None: ...

class HopActions(_message.Message):
    __slots__ = ("count", "count_by", "histogram", "prev_ts", "record", "capture")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    COUNT_BY_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    PREV_TS_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    count: bool
    count_by: _counters_pb2.Field
    histogram: _counters_pb2.Field
    prev_ts: bool
    record: _containers.RepeatedScalarFieldContainer[_counters_pb2.Field]
    capture: int
    def __init__(self, count: bool = ..., count_by: _Optional[_Union[_counters_pb2.Field, str]] = ..., histogram: _Optional[_Union[_counters_pb2.Field, str]] = ..., prev_ts: bool = ..., record: _Optional[_Iterable[_Union[_counters_pb2.Field, str]]] = ..., capture: _Optional[int] = ...) -> None: ...

class EventAttach(_message.Message):
    __slots__ = ("event_index", "name", "tracepoint_group", "tracepoint_event", "program", "where", "count", "count_by", "count_by_arg", "histogram_arg", "record_args", "mark_arg", "latency_arg", "latency_since", "kind", "function")
    EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRACEPOINT_GROUP_FIELD_NUMBER: _ClassVar[int]
    TRACEPOINT_EVENT_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    COUNT_BY_FIELD_NUMBER: _ClassVar[int]
    COUNT_BY_ARG_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_ARG_FIELD_NUMBER: _ClassVar[int]
    RECORD_ARGS_FIELD_NUMBER: _ClassVar[int]
    MARK_ARG_FIELD_NUMBER: _ClassVar[int]
    LATENCY_ARG_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SINCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    event_index: int
    name: str
    tracepoint_group: str
    tracepoint_event: str
    program: str
    where: _containers.RepeatedCompositeFieldContainer[_trace_pb2.EventTerm]
    count: bool
    count_by: _counters_pb2.EventKey
    count_by_arg: str
    histogram_arg: str
    record_args: _containers.RepeatedScalarFieldContainer[str]
    mark_arg: str
    latency_arg: str
    latency_since: int
    kind: _trace_pb2.AttachKind
    function: str
    def __init__(self, event_index: _Optional[int] = ..., name: _Optional[str] = ..., tracepoint_group: _Optional[str] = ..., tracepoint_event: _Optional[str] = ..., program: _Optional[str] = ..., where: _Optional[_Iterable[_Union[_trace_pb2.EventTerm, _Mapping]]] = ..., count: bool = ..., count_by: _Optional[_Union[_counters_pb2.EventKey, str]] = ..., count_by_arg: _Optional[str] = ..., histogram_arg: _Optional[str] = ..., record_args: _Optional[_Iterable[str]] = ..., mark_arg: _Optional[str] = ..., latency_arg: _Optional[str] = ..., latency_since: _Optional[int] = ..., kind: _Optional[_Union[_trace_pb2.AttachKind, str]] = ..., function: _Optional[str] = ...) -> None: ...

class TcpTagging(_message.Message):
    __slots__ = ("netns", "cgroup", "program")
    NETNS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    netns: str
    cgroup: str
    program: str
    def __init__(self, netns: _Optional[str] = ..., cgroup: _Optional[str] = ..., program: _Optional[str] = ...) -> None: ...

class RemoveTrace(_message.Message):
    __slots__ = ("trace", "generation")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    trace: str
    generation: int
    def __init__(self, trace: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class RunPreset(_message.Message):
    __slots__ = ("id", "preset", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    preset: str
    args: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., preset: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PresetResult(_message.Message):
    __slots__ = ("id", "summary_json", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    summary_json: str
    error: str
    def __init__(self, id: _Optional[str] = ..., summary_json: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...
