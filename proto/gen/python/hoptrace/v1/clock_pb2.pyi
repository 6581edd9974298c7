import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetClockKeyRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class ClockKey(_message.Message):
    __slots__ = ("node", "key_id", "key", "refresh_after", "valid_for")
    NODE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REFRESH_AFTER_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_FIELD_NUMBER: _ClassVar[int]
    node: str
    key_id: int
    key: bytes
    refresh_after: _duration_pb2.Duration
    valid_for: _duration_pb2.Duration
    def __init__(self, node: _Optional[str] = ..., key_id: _Optional[int] = ..., key: _Optional[bytes] = ..., refresh_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., valid_for: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
