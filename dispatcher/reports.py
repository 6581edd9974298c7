"""GetReport's, GetPackets', WatchSegmentStats' and ListAgents' clocks' source: the collector's InfluxDB,
queried through hoptrace.results.store."""

from __future__ import annotations

from hoptrace.dispatcher.api import ClockProvider, PacketsProvider, ReportProvider, WindowProvider
from hoptrace.v1 import api_pb2, trace_pb2


def influx_report_provider(url: str, bucket: str, org: str = "-", token: str = "") -> ReportProvider:
    """A ReportProvider reading the collector's InfluxDB; segments follow the applied spec's hop order."""
    from hoptrace.results import store  # imported here: influxdb_client only where reports are served

    def provide(request: api_pb2.GetReportRequest, spec: trace_pb2.TraceSpec | None) -> api_pb2.Report:
        path = [hop.name for hop in spec.hops] if spec is not None else None
        return store.get_report(request, url=url, bucket=bucket, org=org, token=token, path=path)

    return provide


def influx_window_provider(url: str, bucket: str, org: str = "-", token: str = "") -> WindowProvider:
    """A WindowProvider reading the collector's per-second `segment_stats` windows from InfluxDB."""
    from hoptrace.results import store

    def provide(trace: str, after_ns: int, spec: trace_pb2.TraceSpec | None) -> list[api_pb2.SegmentStats]:
        path = [hop.name for hop in spec.hops] if spec is not None else None
        return store.segment_windows(
            trace, url=url, bucket=bucket, org=org, token=token, after_ns=after_ns, path=path
        )

    return provide


def influx_clock_provider(url: str, bucket: str, org: str = "-", token: str = "") -> ClockProvider:
    """A ClockProvider reading the collector's last `node_clock` point of each node from InfluxDB."""
    from hoptrace.results import store

    def provide() -> dict[str, api_pb2.NodeClockStatus]:
        return store.node_clocks(url=url, bucket=bucket, org=org, token=token)

    return provide


def influx_packets_provider(url: str, bucket: str, org: str = "-", token: str = "") -> PacketsProvider:
    """A PacketsProvider reading the exemplars' `hop_latency` points; segments follow the spec's hop order."""
    from hoptrace.results import store

    def provide(request: api_pb2.GetPacketsRequest, spec: trace_pb2.TraceSpec | None) -> api_pb2.PacketList:
        path = [hop.name for hop in spec.hops] if spec is not None else None
        return store.get_packets(request, url=url, bucket=bucket, org=org, token=token, path=path)

    return provide
