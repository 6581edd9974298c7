"""The user API (`hoptrace.v1.Hoptrace`), served by the dispatcher for the CLI and the web UI."""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc

from hoptrace.common.grpcutil import TokenFile, caller_of
from hoptrace.common.version import API_VERSION, package_version
from hoptrace.dispatcher.controller import DispatcherError, TraceController
from hoptrace.dispatcher.discover import run_discovery
from hoptrace.dispatcher.presets import PresetError
from hoptrace.dispatcher.registry import AgentRegistry
from hoptrace.dispatcher.state import AuditLog
from hoptrace.results.timerange import request_range_problem
from hoptrace.v1 import agent_pb2, api_pb2, api_pb2_grpc, trace_pb2

log = logging.getLogger(__name__)

# Answers GetReport: the request and the trace's applied spec (None if the trace is not applied any more),
# whose hop names give the path order. hoptrace.results.store.get_report fits, bound to its InfluxDB.
ReportProvider = Callable[[api_pb2.GetReportRequest, trace_pb2.TraceSpec | None], api_pb2.Report]
# Answers GetPackets, like ReportProvider; hoptrace.results.store.get_packets fits.
PacketsProvider = Callable[[api_pb2.GetPacketsRequest, trace_pb2.TraceSpec | None], api_pb2.PacketList]
# (trace, after unix ns, spec) -> the closed per-second segment windows after that time, oldest first.
WindowProvider = Callable[[str, int, trace_pb2.TraceSpec | None], list[api_pb2.SegmentStats]]
# node -> its clock as the collector last measured it (nodes it never measured are absent).
# hoptrace.results.store.node_clocks fits, bound to its InfluxDB.
ClockProvider = Callable[[], dict[str, api_pb2.NodeClockStatus]]
WATCH_POLL_S = 1.0  # the collector closes one window per second
CLOCK_CACHE_S = 1.0  # the collector writes at most one estimate per node per second


class HoptraceServicer(api_pb2_grpc.HoptraceServicer):
    """Serves `hoptrace.v1.Hoptrace` on top of the controller and the agent registry."""

    def __init__(
        self,
        controller: TraceController,
        registry: AgentRegistry,
        report_provider: ReportProvider | None = None,
        window_provider: WindowProvider | None = None,
        clock_provider: ClockProvider | None = None,
        packets_provider: PacketsProvider | None = None,
        audit: AuditLog | None = None,
        tokens: TokenFile | None = None,
    ) -> None:
        self.controller = controller
        # Who applied, deleted and ran what (ListAudit); callers named by their tokens and certificates.
        self.audit = audit
        self.tokens = tokens
        self.registry = registry
        self.report_provider = report_provider
        self.window_provider = window_provider
        self.clock_provider = clock_provider
        self.packets_provider = packets_provider
        self._clock_lock = threading.Lock()
        self._clocks: tuple[float, dict[str, api_pb2.NodeClockStatus]] = (0.0, {})

    def _node_clocks(self) -> dict[str, api_pb2.NodeClockStatus]:
        """The collector's clock estimates, asked at most once per CLOCK_CACHE_S; none when there is no store
        or it fails (every clock then reads unknown, `measured` false)."""
        if self.clock_provider is None:
            return {}
        with self._clock_lock:
            fetched_at, clocks = self._clocks
            if time.monotonic() - fetched_at < CLOCK_CACHE_S:
                return clocks
            try:
                clocks = self.clock_provider()
            except Exception as error:  # the store is another process: agents are still listed
                log.warning("node clocks unavailable: %s", error)
                clocks = {}
            self._clocks = (time.monotonic(), clocks)
            return clocks

    def _with_clocks(self, agents: list[api_pb2.Agent]) -> list[api_pb2.Agent]:
        clocks = self._node_clocks()
        for agent in agents:
            clock = clocks.get(agent.registration.node)
            if clock is not None:
                agent.clock.CopyFrom(clock)
        return agents

    def _unknown_trace(self, name: str) -> str:
        """Why `name` has nothing to show: not applied, no stored results in the range; the applied traces
        and the closest name."""
        names = [trace.spec.name for trace in self.controller.list()]
        applied = f"traces: {', '.join(names)}" if names else "no trace is applied"
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"no trace named {name!r} ({applied}; none of that name has results in the range){hint}"

    @contextmanager
    def _audited(
        self, context: grpc.ServicerContext, action: str, **fields: object
    ) -> Iterator[api_pb2.AuditEntry]:
        """Record one entry of the audit trail for the call's action when it ends: "ok", or "failed" with the
        dispatcher's answer. The body may fill in what it learns (the generation applied)."""
        caller = caller_of(context, self.tokens)
        entry = api_pb2.AuditEntry(
            action=action,
            token=caller.token,
            token_role=caller.token_role,
            certificate=caller.certificate,
            certificate_role=caller.certificate_role,
            on_behalf_of=caller.on_behalf_of,
            peer=caller.peer,
            **fields,  # type: ignore[arg-type]
        )
        try:
            yield entry
        except (DispatcherError, PresetError) as error:
            entry.outcome, entry.error = "failed", error.message
            entry.generation = entry.generation or getattr(error, "generation", 0)
            raise
        except GeneratorExit:  # a stream (Discover) whose client went away
            entry.outcome, entry.error = "failed", "the client ended the call"
            raise
        except BaseException as error:
            entry.outcome, entry.error = "failed", str(error) or type(error).__name__
            raise
        else:
            entry.outcome = "ok"
        finally:
            entry.at.GetCurrentTime()
            if self.audit is not None:
                self.audit.record(entry)
            log.info(
                "audit: %s %s by token %r (%s), certificate %r%s: %s",
                action,
                entry.trace or entry.preset,
                entry.token,
                entry.token_role,
                entry.certificate,
                f" for {entry.on_behalf_of!r}" if entry.on_behalf_of else "",
                entry.outcome,
            )

    def _run(self, context: grpc.ServicerContext, action: Callable[[], object]) -> object:
        try:
            return action()
        except (DispatcherError, PresetError) as error:
            context.abort(error.code, error.message)
        raise AssertionError("unreachable")  # context.abort raises

    def ValidateTrace(  # noqa: N802
        self, request: api_pb2.ValidateTraceRequest, context: grpc.ServicerContext
    ) -> api_pb2.ValidateTraceResponse:
        """The spec's problems against the schema and the registered agents (empty = valid)."""
        errors = self.controller.validate(request.spec)
        return api_pb2.ValidateTraceResponse(
            errors=[api_pb2.FieldError(field=error.field, reason=error.reason) for error in errors]
        )

    def ApplyTrace(self, request: api_pb2.ApplyTraceRequest, context: grpc.ServicerContext) -> api_pb2.Trace:  # noqa: N802
        """Create or update a trace on every node, all or nothing."""
        try:
            with self._audited(context, "apply", trace=request.spec.name) as entry:
                trace = self.controller.apply(request.spec)
                entry.generation = trace.generation
        except DispatcherError as error:
            context.abort(error.code, error.message)
        return trace

    def ListTraces(  # noqa: N802
        self, request: api_pb2.ListTracesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListTracesResponse:
        """Every applied trace with its nodes' statuses."""
        return api_pb2.ListTracesResponse(traces=self.controller.list())

    def GetTrace(self, request: api_pb2.GetTraceRequest, context: grpc.ServicerContext) -> api_pb2.Trace:  # noqa: N802
        """One trace; NOT_FOUND if it is not applied."""
        return self._run(context, lambda: self.controller.get(request.name))

    def DeleteTrace(  # noqa: N802
        self, request: api_pb2.DeleteTraceRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteTraceResponse:
        """Detach a trace on every node and forget it."""
        generation = self.controller.generation_of(request.name)
        try:
            with self._audited(context, "delete", trace=request.name, generation=generation):
                self.controller.delete(request.name)
        except DispatcherError as error:
            context.abort(error.code, error.message)
        return api_pb2.DeleteTraceResponse()

    def ListAgents(  # noqa: N802
        self, request: api_pb2.ListAgentsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListAgentsResponse:
        """Every agent that registered since the dispatcher started, connected or not, with its clock as the
        collector measured it."""
        return api_pb2.ListAgentsResponse(agents=self._with_clocks(self.registry.agents()))

    def GetAgent(self, request: api_pb2.GetAgentRequest, context: grpc.ServicerContext) -> api_pb2.Agent:  # noqa: N802
        """One agent; NOT_FOUND if that node never registered."""
        agent = self.registry.agent(request.node)
        if agent is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no agent registered for node {request.node!r}")
        return self._with_clocks([agent])[0]

    def GetVersion(
        self, request: api_pb2.GetVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.Version:  # noqa: N802
        """The dispatcher's package version and the API it serves."""
        return api_pb2.Version(dispatcher=package_version(), api=API_VERSION)

    def GetReport(self, request: api_pb2.GetReportRequest, context: grpc.ServicerContext) -> api_pb2.Report:  # noqa: N802
        """The trace's latency decomposition, from the configured report provider (the collector's store)."""
        if self.report_provider is None:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "reports are not configured: start the dispatcher with --influx-url and --influx-bucket",
            )
        if not request.trace:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "trace: required")
        self._check_range(request, context)
        spec = self.controller.spec_of(request.trace)
        try:
            report = self.report_provider(request, spec)
        except Exception as error:  # the store is another process: report its failure, do not crash
            log.exception("report of trace %s failed", request.trace)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"report of trace {request.trace} failed: {error}")
        if spec is None and report.packets == 0 and not report.segments and not report.hops:
            # Neither applied nor stored: a mistyped name must not read as an empty success.
            context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_trace(request.trace))
        return report

    def GetPackets(  # noqa: N802
        self, request: api_pb2.GetPacketsRequest, context: grpc.ServicerContext
    ) -> api_pb2.PacketList:
        """Per-packet timelines of the trace (the slowest, or one by ID), from the collector's store."""
        if self.packets_provider is None:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "packets are not configured: start the dispatcher with --influx-url and --influx-bucket",
            )
        if not request.trace:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "trace: required")
        self._check_range(request, context)
        spec = self.controller.spec_of(request.trace)
        try:
            packets = self.packets_provider(request, spec)
        except Exception as error:  # the store is another process: report its failure, do not crash
            log.exception("packets of trace %s failed", request.trace)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"packets of trace {request.trace} failed: {error}")
        if spec is None and not packets.packets and not self._has_results(request):
            context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_trace(request.trace))
        return packets

    @staticmethod
    def _check_range(
        request: api_pb2.GetReportRequest | api_pb2.GetPacketsRequest, context: grpc.ServicerContext
    ) -> None:
        """INVALID_ARGUMENT naming both ends when the request's range holds no time (a store would fail
        on it with an error of its own, or find nothing)."""
        problem = request_range_problem(request)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

    def _has_results(self, request: api_pb2.GetPacketsRequest) -> bool:
        """Whether the store has anything of the request's trace in its range (a packet ID not seen is an
        empty answer; a trace never seen is NOT_FOUND)."""
        if self.report_provider is None:
            return True  # cannot tell: answer what the packets query found
        query = api_pb2.GetReportRequest(trace=request.trace)  # the same range, the same defaults
        if request.HasField("start"):
            query.start.CopyFrom(request.start)
        if request.HasField("end"):
            query.end.CopyFrom(request.end)
        try:
            return self.report_provider(query, None).packets > 0
        except Exception:  # the store failed after answering the packets query: do not claim absence
            return True

    def WatchSegmentStats(  # noqa: N802
        self, request: api_pb2.WatchSegmentStatsRequest, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.SegmentStats]:
        """Each segment's statistics of every 1 s window as the collector closes it, until the client goes."""
        if self.window_provider is None:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "live statistics are not configured: start the dispatcher with --influx-url and "
                "--influx-bucket",
            )
        if not request.trace:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "trace: required")
        if self.controller.spec_of(request.trace) is None:  # live windows come only from applied traces
            context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_trace(request.trace))
        after = time.time_ns() - 10 * 1_000_000_000  # the last few windows first, then new ones as they close
        while context.is_active():
            try:
                windows = self.window_provider(request.trace, after, self.controller.spec_of(request.trace))
            except Exception as error:  # the store is another process: say so and keep the stream
                log.warning("live statistics of trace %s: %s", request.trace, error)
                windows = []
            for stats in windows:
                after = max(after, stats.at.ToNanoseconds())
                yield stats
            time.sleep(WATCH_POLL_S)

    def WatchSpecs(  # noqa: N802
        self, request: api_pb2.WatchSpecsRequest, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.SpecSet]:
        """Every applied spec now, then again after each apply or delete, until the client goes."""
        version = -1
        while context.is_active():
            changed = self.controller.wait_specs(version, timeout_s=WATCH_POLL_S)
            if changed is not None:
                version, specs = changed
                yield api_pb2.SpecSet(specs=specs)

    def Discover(  # noqa: N802
        self, request: api_pb2.DiscoverRequest, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.DiscoverEvent]:
        """Path discovery on the nodes (all connected agents by default): progress, then the result.
        INVALID_ARGUMENT names the field; a node that failed fails the discovery with its reason."""
        connected = [node for node in self.registry.registrations() if self.registry.connection(node)]
        try:
            with (
                self._audited(context, "discover", preset="discover", nodes=request.nodes or connected),
                self.controller.discovery_origin() as origin,
            ):
                yield from run_discovery(
                    self.controller.presets, connected, request, origin, self.controller.trace_filters()
                )
        except (PresetError, DispatcherError) as error:
            context.abort(error.code, error.message)

    def RunPreset(  # noqa: N802
        self, request: api_pb2.RunPresetRequest, context: grpc.ServicerContext
    ) -> agent_pb2.PresetResult:
        """Run a preset on one node for its duration and return its summary; INVALID_ARGUMENT names the
        field, NOT_FOUND when the node's agent is not connected, FAILED_PRECONDITION when the node failed."""
        try:
            with self._audited(context, "preset", preset=request.preset, nodes=[request.node]):
                return self.controller.presets.run(request.node, request.preset, dict(request.args))
        except PresetError as error:
            context.abort(error.code, error.message)
        raise AssertionError("unreachable")  # context.abort raises

    def ListAudit(  # noqa: N802
        self, request: api_pb2.ListAuditRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListAuditResponse:
        """The audit trail, oldest first: the newest `limit` entries (0: all kept), of one trace if named."""
        if self.audit is None:
            return api_pb2.ListAuditResponse()
        return api_pb2.ListAuditResponse(entries=self.audit.entries(request.limit, request.trace))
