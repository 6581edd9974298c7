"""Keeps the collector's `TraceCatalog` in step with the dispatcher's traces.

The dispatcher owns the specs; the collector needs each trace's path (hop names and nodes, in order) to join
and order hops. It follows the dispatcher's `WatchSpecs` stream: the whole set of applied specs at once,
then again after every apply or delete; a spec comes as soon as its plans go to the agents, before any hop
of it is attached, so the packets in flight while its hops attach are joined on its path. A late path only
delays emission (packets wait in the join window), it never mis-joins; while the dispatcher is away, the
known paths are kept. Until its first set of specs has come the catalog is `awaiting_paths`: the join holds
what the agents send meanwhile (a restarted collector's backlog) instead of joining it without its paths.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import grpc

from hoptrace.collector.catalog import TraceCatalog
from hoptrace.v1 import api_pb2, api_pb2_grpc, trace_pb2

log = logging.getLogger(__name__)

RETRY_S = 1.0  # between reconnects to a dispatcher that is away


def apply_spec_set(catalog: TraceCatalog, specs: Iterable[trace_pb2.TraceSpec], synced: set[str]) -> set[str]:
    """Set every spec of one `SpecSet` into `catalog` and drop those of `synced` it no longer has.

    Returns the names now synced; traces the catalog got elsewhere (a --traces file) are left alone.
    """
    names = set()
    for spec in specs:
        names.add(spec.name)
        try:
            catalog.set_spec(spec)
        except ValueError as error:  # a path the catalog cannot hold: that trace is not joined, the rest are
            log.error("trace %s not followed: %s", spec.name, error)
    for name in synced - names:
        catalog.remove_trace(name)
    return names


def follow_dispatcher(
    catalog: TraceCatalog,
    address: str,
    stop: threading.Event,
    channel: Callable[[], grpc.Channel] | None = None,
) -> threading.Thread:
    """Start a daemon thread that follows the dispatcher's specs at `address` into `catalog` until `stop`.

    `channel` makes the user API channel (TLS, token: hoptrace.common api_channel); default plaintext.
    """
    state: dict[str, grpc.Future | None] = {"call": None}
    catalog.expect_paths()

    def cancel_on_stop() -> None:
        stop.wait()
        call = state["call"]
        if call is not None:
            call.cancel()

    def loop() -> None:
        channel_ = channel() if channel else grpc.insecure_channel(address)
        stub = api_pb2_grpc.HoptraceStub(channel_)
        failing = False
        synced: set[str] = set()
        while not stop.is_set():
            try:
                call = stub.WatchSpecs(api_pb2.WatchSpecsRequest())
                state["call"] = call
                if stop.is_set():
                    call.cancel()
                for spec_set in call:
                    synced = apply_spec_set(catalog, spec_set.specs, synced)
                    catalog.paths_synced()
                    if failing:
                        log.info("dispatcher %s reachable again", address)
                    failing = False
            except grpc.RpcError as err:
                if stop.is_set():
                    break
                if not failing:  # say it once per outage, keep the paths we have
                    log.warning(
                        "dispatcher %s: %s %s; keeping known trace paths",
                        address,
                        err.code().name,
                        err.details(),
                    )
                failing = True
            stop.wait(RETRY_S)
        channel_.close()

    threading.Thread(target=cancel_on_stop, name="catalog-sync-stop", daemon=True).start()
    thread = threading.Thread(target=loop, name="catalog-sync", daemon=True)
    thread.start()
    return thread
