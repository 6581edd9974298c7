"""The dispatcher's user API as its clients use it (the `hoptrace` CLI, the web UI, presets): one channel,
opened on first use and shared by threads, and one mapping of gRPC failures to messages a user reads
(`ApiError`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from hoptrace.common.timeouts import scaled
from hoptrace.v1 import api_pb2, api_pb2_grpc, trace_pb2

# Apply compiles and waits for every agent's status (seconds); the other calls answer at once.
APPLY_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 15.0
# gRPC's words when the dispatcher itself cannot be reached (as opposed to an UNAVAILABLE it answered).
_TRANSPORT_FAILURES = (
    "failed to connect",
    "connection refused",
    "dns resolution",
    "socket closed",
    "backends",
)


class ApiError(Exception):
    """A failed call: `message` is the dispatcher's own text (or why it could not be reached)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class ApiClient:
    """Calls `hoptrace.v1.Hoptrace` on `address`; the channel is opened on first use and shared by threads."""

    def __init__(self, address: str, channel_factory: Callable[[], grpc.Channel] | None = None) -> None:
        self.address = address
        # Makes the channel: mutual TLS and the API token in a deployment (grpcutil.api_channel), plaintext
        # when None (a dispatcher started with --insecure).
        self.channel_factory = channel_factory
        self._stub: api_pb2_grpc.HoptraceStub | None = None
        self._lock = threading.Lock()

    def _get_stub(self) -> api_pb2_grpc.HoptraceStub:
        with self._lock:
            if self._stub is None:
                if self.channel_factory is not None:
                    channel = self.channel_factory()
                else:
                    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
                    channel = grpc.insecure_channel(self.address, options=options)
                self._stub = api_pb2_grpc.HoptraceStub(channel)
            return self._stub

    def call(self, method: str, request: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """Call one API method; gRPC errors become ApiError with the dispatcher's message (or why it could
        not be reached)."""
        try:
            return getattr(self._get_stub(), method)(request, timeout=scaled(timeout))
        except grpc.RpcError as error:
            raise self._error(error, timeout) from None

    def stream(self, method: str, request: Any, timeout: float) -> Iterator[Any]:
        """Call one server-streaming API method and yield its messages; gRPC errors become ApiError, as in
        call()."""
        try:
            yield from getattr(self._get_stub(), method)(request, timeout=timeout)
        except grpc.RpcError as error:
            raise self._error(error, timeout) from None

    def _error(self, error: grpc.RpcError, timeout: float) -> ApiError:
        details = error.details() or str(error.code())
        if error.code() == grpc.StatusCode.UNAVAILABLE and any(
            phrase in details.lower() for phrase in _TRANSPORT_FAILURES
        ):
            details = f"cannot reach the dispatcher at {self.address}: {details}"
        elif error.code() == grpc.StatusCode.UNAUTHENTICATED:
            details = f"the dispatcher refused the request: {details}"
        elif error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            details = f"the dispatcher at {self.address} did not answer within {timeout:g}s"
        return ApiError(details, error.code())

    def agents(self) -> list[api_pb2.Agent]:
        """Every registered agent."""
        return list(self.call("ListAgents", api_pb2.ListAgentsRequest()).agents)

    def traces(self) -> list[api_pb2.Trace]:
        """Every applied trace."""
        return list(self.call("ListTraces", api_pb2.ListTracesRequest()).traces)

    def trace(self, name: str) -> api_pb2.Trace:
        """One applied trace (ApiError NOT_FOUND when there is none)."""
        return self.call("GetTrace", api_pb2.GetTraceRequest(name=name))

    def validate(self, spec: trace_pb2.TraceSpec) -> list[api_pb2.FieldError]:
        """The dispatcher's field errors for `spec` (`field`, `reason`), checked against the agents."""
        return list(self.call("ValidateTrace", api_pb2.ValidateTraceRequest(spec=spec)).errors)

    def apply(self, spec: trace_pb2.TraceSpec) -> api_pb2.Trace:
        """Create or update a trace on every node of its spec."""
        return self.call("ApplyTrace", api_pb2.ApplyTraceRequest(spec=spec), timeout=APPLY_TIMEOUT_S)

    def delete(self, name: str) -> None:
        """Detach a trace everywhere."""
        self.call("DeleteTrace", api_pb2.DeleteTraceRequest(name=name), timeout=APPLY_TIMEOUT_S)
