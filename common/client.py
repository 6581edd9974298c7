"""The dispatcher's user API as its clients use it (the `hoptrace` CLI, the web UI, presets): one channel,
opened on first use and shared by threads, and one mapping of gRPC failures to messages a user reads
(`ApiError`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from hoptrace.common.entry import CliError
from hoptrace.common.grpcutil import DISPATCHER_ENV
from hoptrace.common.timeouts import scaled
from hoptrace.v1 import api_pb2, api_pb2_grpc, trace_pb2

# Apply compiles and waits for every agent's status (seconds); the other calls answer at once.
APPLY_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 15.0
# A report or a packet list runs several Flux queries over the range: longer than a plain call.
QUERY_TIMEOUT_S = 60.0
# Beyond its own duration, a preset or a discovery loads and attaches on the nodes, reads, and answers: the
# dispatcher waits 30 s for that (dispatcher/presets.py RESULT_GRACE_S), its client a little longer.
RUN_GRACE_S = 45.0
# gRPC's words when the dispatcher itself cannot be reached (as opposed to an UNAVAILABLE it answered).
_TRANSPORT_FAILURES = (
    "failed to connect",
    "connection refused",
    "dns resolution",
    "socket closed",
    "backends",
)


class ApiError(CliError):
    """A failed call: `message` is the dispatcher's own text (or why it could not be reached). A CliError:
    a program that does not handle it says it in one line (hoptrace.common.entry.run_command)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class ApiClient:
    """Calls `hoptrace.v1.Hoptrace` on `address`; the channel is opened on first use and shared by threads."""

    def __init__(
        self,
        address: str,
        channel_factory: Callable[[], grpc.Channel] | None = None,
        metadata: Callable[[], list[tuple[str, str]]] | None = None,
    ) -> None:
        self.address = address
        # Makes the channel: mutual TLS and the API token in a deployment (grpcutil.api_channel), plaintext
        # when None (a dispatcher started with --insecure).
        self.channel_factory = channel_factory
        # Metadata added to every call, asked for at each: the web UI says which of its users acts
        # (grpcutil.ON_BEHALF_OF_HEADER, in the dispatcher's audit trail).
        self.metadata = metadata
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
            return getattr(self._get_stub(), method)(
                request, timeout=scaled(timeout), metadata=self._metadata()
            )
        except grpc.RpcError as error:
            raise self._error(error, timeout) from None

    def _metadata(self) -> list[tuple[str, str]] | None:
        return self.metadata() if self.metadata is not None else None

    def stream(self, method: str, request: Any, timeout: float) -> Iterator[Any]:
        """Call one server-streaming API method and yield its messages; gRPC errors become ApiError, as in
        call()."""
        try:
            yield from getattr(self._get_stub(), method)(request, timeout=timeout, metadata=self._metadata())
        except grpc.RpcError as error:
            raise self._error(error, timeout) from None

    def _error(self, error: grpc.RpcError, timeout: float) -> ApiError:
        details = error.details() or str(error.code())
        if error.code() == grpc.StatusCode.UNAVAILABLE and any(
            phrase in details.lower() for phrase in _TRANSPORT_FAILURES
        ):
            details = (
                f"cannot reach the dispatcher at {self.address}: {details} (is `hoptrace dispatcher` running "
                f"there? the address is --dispatcher or ${DISPATCHER_ENV})"
            )
        elif error.code() == grpc.StatusCode.UNAUTHENTICATED:
            details = f"the dispatcher refused the request: {details}"
        elif error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            details = f"the dispatcher at {self.address} did not answer within {timeout:g}s"
        return ApiError(details, error.code())

    def agents(self, timeout: float = CALL_TIMEOUT_S) -> list[api_pb2.Agent]:
        """Every registered agent."""
        return list(self.call("ListAgents", api_pb2.ListAgentsRequest(), timeout=timeout).agents)

    def agent(self, node: str) -> api_pb2.Agent:
        """The agent of `node` (ApiError NOT_FOUND when none registered)."""
        return self.call("GetAgent", api_pb2.GetAgentRequest(node=node))

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

    def report(
        self,
        trace: str,
        since_s: float | None = None,
        *,
        with_series: bool = False,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> api_pb2.Report:
        """The trace's report over the `since_s` seconds ending now, or from `start_ns` to `end_ns` (ns since
        the epoch; None: the dispatcher's defaults); `with_series` adds each segment's p50/p99 over time."""
        request = api_pb2.GetReportRequest(trace=trace, with_series=with_series)
        _set_range(request, since_s, start_ns, end_ns)
        return self.call("GetReport", request, timeout=QUERY_TIMEOUT_S)

    def packets(
        self,
        trace: str,
        since_s: float | None = None,
        *,
        packet_id: int = 0,
        slowest: int = 10,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> api_pb2.PacketList:
        """The `slowest` packets of the trace end to end over the `since_s` seconds ending now (or from
        `start_ns` to `end_ns`, as report()), or the one packet `packet_id` (not 0)."""
        request = api_pb2.GetPacketsRequest(trace=trace, packet_id=packet_id, slowest=slowest)
        _set_range(request, since_s, start_ns, end_ns)
        return self.call("GetPackets", request, timeout=QUERY_TIMEOUT_S)

    def version(self, timeout: float = CALL_TIMEOUT_S) -> api_pb2.Version:
        """The dispatcher's version and API."""
        return self.call("GetVersion", api_pb2.GetVersionRequest(), timeout=timeout)

    def run_preset(self, request: api_pb2.RunPresetRequest, duration_s: float) -> api_pb2.PresetResult:
        """Run a preset on a node for `duration_s` seconds; it answers after them."""
        return self.call("RunPreset", request, timeout=duration_s + RUN_GRACE_S)

    def audit(self, limit: int = 0, trace: str = "") -> list[api_pb2.AuditEntry]:
        """The dispatcher's audit trail, oldest first: the newest `limit` entries (0: all it keeps), of
        `trace` only when given."""
        return list(self.call("ListAudit", api_pb2.ListAuditRequest(limit=limit, trace=trace)).entries)

    def discover(self, request: api_pb2.DiscoverRequest) -> Iterator[api_pb2.DiscoverEvent]:
        """The events of a discovery: progress while the agents look, then the result."""
        return self.stream("Discover", request, timeout=request.duration_ms / 1000 + RUN_GRACE_S)


def _set_range(request: Any, since_s: float | None, start_ns: int | None, end_ns: int | None) -> None:
    """Set a GetReportRequest's or GetPacketsRequest's start (`start_ns`, else `since_s` before now) and end;
    unset ones are the dispatcher's to choose, and it checks the range."""
    if start_ns is not None:
        request.start.FromNanoseconds(start_ns)
    elif since_s is not None:
        request.start.FromNanoseconds(_start_ns(since_s))
    if end_ns is not None:
        request.end.FromNanoseconds(end_ns)


def _start_ns(since_s: float) -> int:
    """The start, in ns since the epoch, of the range of `since_s` seconds ending now."""
    return time.time_ns() - round(since_s * 1e9)
