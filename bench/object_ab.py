"""A BPF change measured in place: this build's hop object against another revision's, side by side.

`go test -bench ObjectAB ./internal/loader` compares two objects in `PROG_TEST_RUN` (program and data hot);
this runs both on real traffic instead: the 8-hop c1 -> c2 VXLAN path, sockperf UDP at 20 k packets/s,
every packet tagged at c1's eth0 and recorded at every hop, the two objects' agents in interleaved rounds
(order alternating). Per object it reports bpf_stats' ns per run of the tagger (a-c1-eth0-out) and of the
five tc hops that record without tagging (their run time over their runs).

    .venv/bin/python bench/object_ab.py --rounds 5 --against HEAD~1
    .venv/bin/python bench/object_ab.py --rounds 5 --against HEAD~1 --non-matching

`--non-matching` filters on another port: every hop parses each packet and returns at the filter (the
tagger then tags nothing: its figure is a non-matching hop's too).

`--against REV` builds kernel-patch/ as it was at REV (git archive) with this tree's vmlinux.h, as
`make bpf` does; the current object is kernel-patch/build/hoptrace.bpf.o (run `make build` first).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bpf_cost import OTHER_PORT, hop_prog_ids, hop_run_times, prog_stats
from ring_cost import MPS, SECONDS, TAGGER, build_bpf, recording_ns_per_run

from common import (
    REPO,
    SOCKPERF_PORT,
    RecordSink,
    TwoHostTopology,
    bpf_stats_enabled,
    log,
    median,
    path_agents,
    path_plans,
)


def build_revision(rev: str, workdir: Path) -> Path:
    """kernel-patch/ at `rev`, built into workdir."""
    src = workdir / "rev"
    src.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "kernel-patch"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    rev_src = src / "kernel-patch"
    return build_bpf(rev_src / "hoptrace.bpf.c", rev_src / "include", workdir / "against.bpf.o")


def measure(
    topo: TwoHostTopology,
    sink: RecordSink,
    workdir: Path,
    name: str,
    obj: Path,
    port: int,
    seconds: int = SECONDS,
) -> tuple[float, float]:
    """(tagger, recording hops) ns per run with `obj` loaded by both agents, filtering on `port`, over
    `seconds` of traffic."""
    filter_ = {"protocol": "udp", "dst": topo.addr("c2"), "dstPort": port}
    plans = path_plans(topo, f"objectab-{name}", filter_)
    for plan in plans:
        plan["objectPath"] = str(obj)
    with path_agents(topo, sink.addr, workdir, plans) as (a, b):
        ids = hop_prog_ids(topo, {"host-a": a.pid, "host-b": b.pid})
        before = prog_stats(ids)
        hop_run_times(ids, topo, seconds, MPS)
        after = prog_stats(ids)
        recording = recording_ns_per_run(ids, before, after)
    ns, runs = (after[TAGGER][i] - before[TAGGER][i] for i in (0, 1))
    if not runs or recording is None:
        raise RuntimeError(f"{name}: the hops did not run (tagger {runs} runs)")
    return ns / runs, recording


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", default="HEAD", help="the git revision whose kernel-patch/ is compared")
    ap.add_argument("--non-matching", action="store_true", help="filter on another port than the traffic's")
    ap.add_argument("--seconds", type=int, default=SECONDS, help=f"traffic per object and round ({SECONDS})")
    args = ap.parse_args()
    current = REPO / "kernel-patch" / "build" / "hoptrace.bpf.o"
    if not current.exists():
        ap.error(f"{current} is missing: run make build")
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-object-ab-"))
    sink = RecordSink()
    topo = TwoHostTopology("hab", overlay="vxlan")
    results: dict[str, list[tuple[float, float]]] = {args.against: [], "current": []}
    try:
        objects = {args.against: build_revision(args.against, workdir), "current": current}
        topo.create()
        with bpf_stats_enabled():
            for r in range(args.rounds):
                for name in list(objects)[:: 1 if r % 2 == 0 else -1]:
                    port = OTHER_PORT if args.non_matching else SOCKPERF_PORT
                    tagger, recording = measure(topo, sink, workdir, name, objects[name], port, args.seconds)
                    results[name].append((tagger, recording))
                    log(f"object_ab round {r}: {name} tagger {tagger:.0f} ns, recording {recording:.0f} ns")
    finally:
        topo.destroy()
        sink.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print("| object | tagger ns per run (median, rounds) | recording tc hops ns per run (median, rounds) |")
    print("|---|---|---|")
    for name, values in results.items():
        tagger = ", ".join(f"{t:.0f}" for t, _ in values)
        recording = ", ".join(f"{x:.0f}" for _, x in values)
        print(
            f"| `{name}` | {median([t for t, _ in values]):.0f} ({tagger}) "
            f"| {median([x for _, x in values]):.0f} ({recording}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
