from hoptrace.v1 import counters_pb2 as _counters_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttachKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTACH_KIND_UNSPECIFIED: _ClassVar[AttachKind]
    ATTACH_KIND_TC_INGRESS: _ClassVar[AttachKind]
    ATTACH_KIND_TC_EGRESS: _ClassVar[AttachKind]
    ATTACH_KIND_XDP: _ClassVar[AttachKind]
    ATTACH_KIND_CGROUP_INGRESS: _ClassVar[AttachKind]
    ATTACH_KIND_CGROUP_EGRESS: _ClassVar[AttachKind]
    ATTACH_KIND_TRACEPOINT: _ClassVar[AttachKind]
    ATTACH_KIND_FENTRY: _ClassVar[AttachKind]
    ATTACH_KIND_KPROBE: _ClassVar[AttachKind]
    ATTACH_KIND_SOCKET_READ: _ClassVar[AttachKind]
    ATTACH_KIND_UPROBE: _ClassVar[AttachKind]
    ATTACH_KIND_URETPROBE: _ClassVar[AttachKind]
    ATTACH_KIND_FEXIT: _ClassVar[AttachKind]
    ATTACH_KIND_KRETPROBE: _ClassVar[AttachKind]
ATTACH_KIND_UNSPECIFIED: AttachKind
ATTACH_KIND_TC_INGRESS: AttachKind
ATTACH_KIND_TC_EGRESS: AttachKind
ATTACH_KIND_XDP: AttachKind
ATTACH_KIND_CGROUP_INGRESS: AttachKind
ATTACH_KIND_CGROUP_EGRESS: AttachKind
ATTACH_KIND_TRACEPOINT: AttachKind
ATTACH_KIND_FENTRY: AttachKind
ATTACH_KIND_KPROBE: AttachKind
ATTACH_KIND_SOCKET_READ: AttachKind
ATTACH_KIND_UPROBE: AttachKind
ATTACH_KIND_URETPROBE: AttachKind
ATTACH_KIND_FEXIT: AttachKind
ATTACH_KIND_KRETPROBE: AttachKind

class TraceSpec(_message.Message):
    __slots__ = ("name", "filter", "sample", "hops", "events", "drops", "drop_hops")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    DROP_HOPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    filter: Filter
    sample: int
    hops: _containers.RepeatedCompositeFieldContainer[HopSpec]
    events: _containers.RepeatedCompositeFieldContainer[EventSpec]
    drops: bool
    drop_hops: _containers.RepeatedCompositeFieldContainer[DropHop]
    def __init__(self, name: _Optional[str] = ..., filter: _Optional[_Union[Filter, _Mapping]] = ..., sample: _Optional[int] = ..., hops: _Optional[_Iterable[_Union[HopSpec, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[EventSpec, _Mapping]]] = ..., drops: bool = ..., drop_hops: _Optional[_Iterable[_Union[DropHop, _Mapping]]] = ...) -> None: ...

class DropHop(_message.Message):
    __slots__ = ("node", "hop_index", "reasons", "netns", "name")
    class ReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    HOP_INDEX_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    NETNS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    node: str
    hop_index: int
    reasons: _containers.ScalarMap[int, str]
    netns: str
    name: str
    def __init__(self, node: _Optional[str] = ..., hop_index: _Optional[int] = ..., reasons: _Optional[_Mapping[int, str]] = ..., netns: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class EventSpec(_message.Message):
    __slots__ = ("name", "node", "tracepoint", "where", "actions", "key", "kprobe", "fentry")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TRACEPOINT_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KPROBE_FIELD_NUMBER: _ClassVar[int]
    FENTRY_FIELD_NUMBER: _ClassVar[int]
    name: str
    node: str
    tracepoint: str
    where: _containers.RepeatedCompositeFieldContainer[EventTerm]
    actions: _containers.RepeatedCompositeFieldContainer[ActionSpec]
    key: str
    kprobe: str
    fentry: str
    def __init__(self, name: _Optional[str] = ..., node: _Optional[str] = ..., tracepoint: _Optional[str] = ..., where: _Optional[_Iterable[_Union[EventTerm, _Mapping]]] = ..., actions: _Optional[_Iterable[_Union[ActionSpec, _Mapping]]] = ..., key: _Optional[str] = ..., kprobe: _Optional[str] = ..., fentry: _Optional[str] = ...) -> None: ...

class EventTerm(_message.Message):
    __slots__ = ("arg", "op", "values", "text")
    ARG_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    arg: str
    op: _counters_pb2.EventOp
    values: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, arg: _Optional[str] = ..., op: _Optional[_Union[_counters_pb2.EventOp, str]] = ..., values: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ("protocol", "src", "dst", "src_port", "dst_port")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_PORT_FIELD_NUMBER: _ClassVar[int]
    DST_PORT_FIELD_NUMBER: _ClassVar[int]
    protocol: str
    src: str
    dst: str
    src_port: int
    dst_port: int
    def __init__(self, protocol: _Optional[str] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., src_port: _Optional[int] = ..., dst_port: _Optional[int] = ...) -> None: ...

class HopSpec(_message.Message):
    __slots__ = ("name", "node", "at", "dev", "netns", "cgroup", "actions", "workload")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DEV_FIELD_NUMBER: _ClassVar[int]
    NETNS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    name: str
    node: str
    at: str
    dev: str
    netns: str
    cgroup: str
    actions: _containers.RepeatedCompositeFieldContainer[ActionSpec]
    workload: Workload
    def __init__(self, name: _Optional[str] = ..., node: _Optional[str] = ..., at: _Optional[str] = ..., dev: _Optional[str] = ..., netns: _Optional[str] = ..., cgroup: _Optional[str] = ..., actions: _Optional[_Iterable[_Union[ActionSpec, _Mapping]]] = ..., workload: _Optional[_Union[Workload, _Mapping]] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("container_id", "container_name", "image", "pod_namespace", "pod_name", "netns", "cgroup")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    NETNS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    container_name: str
    image: str
    pod_namespace: str
    pod_name: str
    netns: str
    cgroup: str
    def __init__(self, container_id: _Optional[str] = ..., container_name: _Optional[str] = ..., image: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., pod_name: _Optional[str] = ..., netns: _Optional[str] = ..., cgroup: _Optional[str] = ...) -> None: ...

class ActionSpec(_message.Message):
    __slots__ = ("kind", "by", "field", "fields", "since", "bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    by: str
    field: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    since: str
    bytes: int
    def __init__(self, kind: _Optional[str] = ..., by: _Optional[str] = ..., field: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., since: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...
