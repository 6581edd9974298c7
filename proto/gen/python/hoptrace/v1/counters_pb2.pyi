from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class Counter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COUNTER_SEEN: _ClassVar[Counter]
    COUNTER_MATCHED: _ClassVar[Counter]
    COUNTER_RECORDED: _ClassVar[Counter]
    COUNTER_TAGGED: _ClassVar[Counter]
    COUNTER_UNTAGGED: _ClassVar[Counter]
    COUNTER_TOO_BIG: _ClassVar[Counter]
    COUNTER_GSO_SKIPPED: _ClassVar[Counter]
    COUNTER_NOT_MATCHED: _ClassVar[Counter]
    COUNTER_PARSE_TRUNCATED: _ClassVar[Counter]
    COUNTER_PARSE_MALFORMED: _ClassVar[Counter]
    COUNTER_PARSE_NON_IP: _ClassVar[Counter]
    COUNTER_RINGBUF_FULL: _ClassVar[Counter]
    COUNTER_BYTES: _ClassVar[Counter]
    COUNTER_TAG_FAILED: _ClassVar[Counter]
    COUNTER_LATENCY_MISS: _ClassVar[Counter]
    COUNTER_COUNT_KEYS_FULL: _ClassVar[Counter]
    COUNTER_SOCK_READ_LOST: _ClassVar[Counter]

class Field(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FIELD_UNSPECIFIED: _ClassVar[Field]
    FIELD_CPU: _ClassVar[Field]
    FIELD_LEN: _ClassVar[Field]
    FIELD_IFINDEX: _ClassVar[Field]
    FIELD_MARK: _ClassVar[Field]
    FIELD_PRIORITY: _ClassVar[Field]
    FIELD_LATENCY: _ClassVar[Field]
    FIELD_NETNS: _ClassVar[Field]
    FIELD_CGROUP: _ClassVar[Field]
    FIELD_QUEUE_MAPPING: _ClassVar[Field]
    FIELD_GSO_SEGS: _ClassVar[Field]
    FIELD_GSO_SIZE: _ClassVar[Field]
    FIELD_TOS: _ClassVar[Field]
    FIELD_TTL: _ClassVar[Field]
    FIELD_IP_ID: _ClassVar[Field]
    FIELD_TCP_FLAGS: _ClassVar[Field]
    FIELD_TCP_WINDOW: _ClassVar[Field]
    FIELD_PID: _ClassVar[Field]
    FIELD_DROP_REASON: _ClassVar[Field]
    FIELD_TCP_SEQ: _ClassVar[Field]
    FIELD_TCP_ACK: _ClassVar[Field]
    FIELD_RMEM: _ClassVar[Field]
    FIELD_BACKLOG: _ClassVar[Field]
    FIELD_COMM: _ClassVar[Field]
    FIELD_DROP_FUNCTION: _ClassVar[Field]

class EventOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_OP_UNSPECIFIED: _ClassVar[EventOp]
    EVENT_OP_EQ: _ClassVar[EventOp]
    EVENT_OP_NE: _ClassVar[EventOp]
    EVENT_OP_LT: _ClassVar[EventOp]
    EVENT_OP_GT: _ClassVar[EventOp]
    EVENT_OP_BIT: _ClassVar[EventOp]
    EVENT_OP_IN: _ClassVar[EventOp]

class EventKey(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KEY_TOTAL: _ClassVar[EventKey]
    EVENT_KEY_CPU: _ClassVar[EventKey]
    EVENT_KEY_ARG: _ClassVar[EventKey]
COUNTER_SEEN: Counter
COUNTER_MATCHED: Counter
COUNTER_RECORDED: Counter
COUNTER_TAGGED: Counter
COUNTER_UNTAGGED: Counter
COUNTER_TOO_BIG: Counter
COUNTER_GSO_SKIPPED: Counter
COUNTER_NOT_MATCHED: Counter
COUNTER_PARSE_TRUNCATED: Counter
COUNTER_PARSE_MALFORMED: Counter
COUNTER_PARSE_NON_IP: Counter
COUNTER_RINGBUF_FULL: Counter
COUNTER_BYTES: Counter
COUNTER_TAG_FAILED: Counter
COUNTER_LATENCY_MISS: Counter
COUNTER_COUNT_KEYS_FULL: Counter
COUNTER_SOCK_READ_LOST: Counter
FIELD_UNSPECIFIED: Field
FIELD_CPU: Field
FIELD_LEN: Field
FIELD_IFINDEX: Field
FIELD_MARK: Field
FIELD_PRIORITY: Field
FIELD_LATENCY: Field
FIELD_NETNS: Field
FIELD_CGROUP: Field
FIELD_QUEUE_MAPPING: Field
FIELD_GSO_SEGS: Field
FIELD_GSO_SIZE: Field
FIELD_TOS: Field
FIELD_TTL: Field
FIELD_IP_ID: Field
FIELD_TCP_FLAGS: Field
FIELD_TCP_WINDOW: Field
FIELD_PID: Field
FIELD_DROP_REASON: Field
FIELD_TCP_SEQ: Field
FIELD_TCP_ACK: Field
FIELD_RMEM: Field
FIELD_BACKLOG: Field
FIELD_COMM: Field
FIELD_DROP_FUNCTION: Field
EVENT_OP_UNSPECIFIED: EventOp
EVENT_OP_EQ: EventOp
EVENT_OP_NE: EventOp
EVENT_OP_LT: EventOp
EVENT_OP_GT: EventOp
EVENT_OP_BIT: EventOp
EVENT_OP_IN: EventOp
EVENT_KEY_TOTAL: EventKey
EVENT_KEY_CPU: EventKey
EVENT_KEY_ARG: EventKey
