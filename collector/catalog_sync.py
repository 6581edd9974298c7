"""Keeps the collector's `TraceCatalog` in step with the dispatcher's traces.

The dispatcher owns the specs; the collector needs each trace's path (hop names and nodes, in order) to join
and order hops. Polling ListTraces is enough: paths change only on apply/delete, and a late path only delays
emission (packets wait in the join window), it never mis-joins.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


def sync_catalog_once(
    catalog: TraceCatalog, stub: api_pb2_grpc.HoptraceStub, synced: set[str], timeout_s: float = 5.0
) -> set[str]:
    """Set every trace the dispatcher knows into `catalog` and drop those of `synced` it no longer has.

    Returns the names now synced; traces the catalog got elsewhere (a --traces file) are left alone.
    """
    traces = stub.ListTraces(api_pb2.ListTracesRequest(), timeout=timeout_s).traces
    names = set()
    for trace in traces:
        names.add(trace.spec.name)
        catalog.set_spec(trace.spec)
    for name in synced - names:
        catalog.remove_trace(name)
    return names


def follow_dispatcher(
    catalog: TraceCatalog,
    address: str,
    stop: threading.Event,
    interval_s: float = 1.0,
    channel: Callable[[], grpc.Channel] | None = None,
) -> threading.Thread:
    """Start a daemon thread that syncs `catalog` from the dispatcher at `address` every `interval_s`.

    `channel` makes the user API channel (TLS, token: hoptrace.cli.grpcutil.api_channel); default plaintext.
    """

    def loop() -> None:
        channel_ = channel() if channel else grpc.insecure_channel(address)
        stub = api_pb2_grpc.HoptraceStub(channel_)
        failing = False
        synced: set[str] = set()
        while not stop.is_set():
            try:
                synced = sync_catalog_once(catalog, stub, synced)
                if failing:
                    log.info("dispatcher %s reachable again", address)
                failing = False
            except grpc.RpcError as err:
                if not failing:  # say it once per outage, keep the paths we have
                    log.warning(
                        "dispatcher %s: %s %s; keeping known trace paths",
                        address,
                        err.code().name,
                        err.details(),
                    )
                failing = True
            stop.wait(interval_s)
        channel_.close()

    thread = threading.Thread(target=loop, name="catalog-sync", daemon=True)
    thread.start()
    return thread
