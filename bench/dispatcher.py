"""Dispatcher: spec -> compiled objects for every node (cold and cached), apply -> active on every agent.

- compile: `compile_spec` of the 8-hop VXLAN spec with a `BpfCompiler` whose cache directory is new
(cold: clang
  runs, the precompiled vmlinux header included), then again on the same compiler (in-memory cache) and
  on a new
  compiler sharing the directory (disk cache, what a restarted dispatcher sees);
- apply: the whole system on the VXLAN topology; `ApplyTrace` returns once every node's agent reports the
trace
  active, so its wall time is apply -> active. The first apply of a dispatcher compiles; later ones (new trace
  names, same programs) hit its cache.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from common import BenchContext, TwoHostTopology, log, median, start_cluster, target
from hoptrace.dispatcher.compile import BpfCompiler, compile_spec
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.spec import check_spec
from hoptrace.v1 import api_pb2


def compile_times(rounds: int) -> dict[str, Any]:
    """Cold, memory-cached and disk-cached compile times of the 8-hop spec (seconds)."""
    spec = vxlan_path_spec(TwoHostTopology("hbcompile"), "bench-compile")  # only names and addresses are used
    checked = check_spec(spec)
    cold, memory, disk = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="hoptrace-bench-cc-") as cache:
            compiler = BpfCompiler(cache_dir=Path(cache))
            t0 = time.monotonic()
            plans = compile_spec(checked, 1, compiler)
            cold.append(time.monotonic() - t0)
            t0 = time.monotonic()
            compile_spec(checked, 2, compiler)
            memory.append(time.monotonic() - t0)
            t0 = time.monotonic()
            compile_spec(checked, 3, BpfCompiler(cache_dir=Path(cache)))
            disk.append(time.monotonic() - t0)
    return {
        "nodes": len(plans),
        "object_bytes": {node: len(plan.object) for node, plan in plans.items()},
        "cold_s": cold,
        "memory_cached_s": memory,
        "disk_cached_s": disk,
    }


def apply_times(ctx: BenchContext, applies: int) -> dict[str, Any]:
    """Wall time of ApplyTrace (apply -> active on both agents), first and later applies."""
    topo = TwoHostTopology(ctx.prefix(), overlay="vxlan")
    cluster = None
    times: list[float] = []
    try:
        topo.create()
        cluster = start_cluster(ctx.influx().url, topo, ctx.workdir / "dispatcher-cluster")
        for i in range(applies):
            name = f"bench-apply-{i}"
            t0 = time.monotonic()
            trace = cluster.apply(vxlan_path_spec(topo, name))
            times.append(time.monotonic() - t0)
            inactive = [s.trace for s in trace.nodes if not s.active]
            if inactive:
                raise RuntimeError(f"apply returned with inactive nodes: {trace.nodes}")
            cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=name), timeout=30)
    finally:
        if cluster is not None:
            cluster.stop()
        topo.destroy()
    return {"first_s": times[0], "later_s": times[1:], "later_median_s": median(times[1:])}


def run(ctx: BenchContext) -> dict[str, Any]:
    """Compile and apply timings."""
    comp = compile_times(ctx.size(1, 3))
    log(
        f"dispatcher compile: cold {median(comp['cold_s']):.2f} s, cached {median(comp['memory_cached_s']):.3f} s"  # noqa: E501
    )
    app = apply_times(ctx, ctx.size(3, 10))
    log(f"dispatcher apply: first {app['first_s']:.2f} s, later median {app['later_median_s']:.2f} s")
    cold = median(comp["cold_s"])
    return {
        "compile": comp,
        "apply": app,
        "summary": {
            "compile_cold_s": cold,
            "compile_memory_cached_s": median(comp["memory_cached_s"]),
            "compile_disk_cached_s": median(comp["disk_cached_s"]),
            "apply_first_s": app["first_s"],
            "apply_later_median_s": app["later_median_s"],
        },
        "targets": [
            target("spec -> compiled objects for all nodes (cold)", cold, 2.0, "s"),
            target("apply -> active on every agent (cached objects)", app["later_median_s"], 1.0, "s"),
            target("apply -> active on every agent (first apply, compiling)", app["first_s"], 1.0, "s"),
        ],
        "table": {
            "columns": ["step", "seconds"],
            "rows": [
                ["compile cold (median)", cold],
                ["compile, in-memory cache", median(comp["memory_cached_s"])],
                ["compile, disk cache (new compiler)", median(comp["disk_cached_s"])],
                ["apply -> active, first apply", app["first_s"]],
                ["apply -> active, later applies (median)", app["later_median_s"]],
            ],
        },
    }
