"""What the records ring costs a traced tc hop in place, side by side.

The 8-hop c1 -> c2 VXLAN path, sockperf UDP at a fixed rate, every packet tagged and recorded at every hop;
bpf_stats' ns per run of the five tc hops that record but do not tag (below), conditions
interleaved in rounds:

- `ring`: the object as built, the agent's ring of 8 MiB (its default);
- `ring1M`, `ring128M`: the same with a ring of 1 or 128 MiB (do the cold lines of a large ring cost?);
- `local`: the same object but for one change, built here from a copy of kernel-patch/: the record is
  written into a per-CPU array slot instead of the shared ring (no reserve, no lock, a line that stays in
  this CPU's cache; nothing reaches the agent). What is left is what the hop costs besides the ring;
- `empty`: a tc program that only returns at the same hops (`bpf_cost.empty_tc_programs`);
- `floor`: the least any design that records every packet at every hop must do, in place of the agent's
  recording tc hops (their tcx links detached, this one attached with clsact): read 4 bytes of the packet
  (where a UDP ID lies), take the clock, and reserve, fill and submit a record in the agent's own ring,
  which the agent reads as usual (FLOOR_SOURCE). No parsing, no filter, no counters;
- `floor_local`: the same, but the record written into a per-CPU array slot (no ring);
- `other`: the agents' filter names another port: every hop parses each packet and returns at the filter;
- `floor_other`: the same agents, and at the recording hops the least any filter on the flow does instead
  (OTHER_FLOOR_SOURCE: Ethernet, IPv4 and UDP by direct reads, the VXLAN packet's inner ones at the
  wire hops, the destination port compared; no counters);
- `shared`: the agent's hop programs, but one program per node runs at all of its recording hops (the
  others' tcx links detached, the first one's program attached there with clsact): its code and maps stay
  hot from one hop to the next. Does the size of the program (5,000+ instructions, a copy per hop) cost?
- `..._pin`: client and server on one vCPU (`common.PINNED_CPU`), so every hop runs there: no other CPU
  writes the ring's lock or head meanwhile (the agent still reads the ring from wherever it runs).

    .venv/bin/python bench/ring_cost.py --rounds 3 \\
        --conditions ring,ring1M,ring128M,ring_pin,local,local_pin,empty,empty_pin,floor,floor_local,shared
    .venv/bin/python bench/ring_cost.py --rounds 3 --conditions other,floor_other,empty

The figure per condition is the recording tc hops' time over their runs (sum of bpf_stats run_time_ns over
sum of run_cnt, each program once): what a recorded packet costs per hop, whichever program ran there.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bpf_cost import OTHER_PORT, TC_HOPS, empty_tc_programs, hop_prog_ids, hop_run_times, prog_stats

from common import (
    REPO,
    SOCKPERF_PORT,
    RecordSink,
    TwoHostTopology,
    bpf_stats_enabled,
    bpftool_json,
    log,
    median,
    path_agents,
    path_plans,
    progs_of,
)

RINGS = {"ring": 8 << 20, "ring1M": 1 << 20, "ring128M": 128 << 20, "local": 8 << 20}
CONDITIONS = (
    "ring", "ring1M", "ring128M", "local", "empty", "floor", "floor_local", "shared", "other", "floor_other"
)  # fmt: skip
SECONDS, MPS = 5, 20_000
TAGGER = "a-c1-eth0-out"  # it also grows the packet: left out
RECORDING = [hop for hop in TC_HOPS if hop != TAGGER]
# `shared`: the program of the first recording hop of each node runs at its others too.
SHARED = {"a-vxlan-out": ["a-wire-out"], "b-wire-in": ["b-vxlan-in", "b-c2-eth0-in"]}

# `floor`: a record per packet and nothing else. The ID is read where a UDP ID lies in an unpadded frame
# (its last 4 bytes); the record is the agent's layout (hoptrace.h), in its trace's slot: the agent ships
# it as it ships its hops' records.
FLOOR_SOURCE = """\
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hoptrace.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* replaced by the agent's ring at load (bpftool's map name records id) */
} records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hoptrace_record);
} local_record SEC(".maps");

SEC("tc") int floor_tc(struct __sk_buff *skb)
{
	struct hoptrace_record *rec;
	__u32 id;

	if (bpf_skb_load_bytes(skb, skb->len - 4, &id, sizeof(id)))
		return -1;
#ifdef FLOOR_LOCAL
	__u32 slot = 0;

	rec = bpf_map_lookup_elem(&local_record, &slot);
#else
	rec = bpf_ringbuf_reserve(&records, sizeof(*rec), 0);
#endif
	if (!rec)
		return -1;
	rec->ts_ns = bpf_ktime_get_ns();
	rec->packet_id = id;
	rec->flow_hash = 0;
	rec->ifindex = skb->ifindex;
	rec->wire_len = skb->len;
	rec->hop_index = 0;
	rec->trace_slot = TRACE_SLOT;
	rec->cpu = bpf_get_smp_processor_id();
	rec->flags = 0;
#ifndef FLOOR_LOCAL
	bpf_ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
#endif
	return -1; /* TC_ACT_UNSPEC: the packet goes on untouched */
}

char LICENSE[] SEC("license") = "GPL";
"""

# The `local` object's one change to hop.bpf.h: the record goes to a per-CPU slot, not the ring.
RESERVE = """\
	if (with_capture) {
		if (with_values)
			return with_addresses
"""
# The sample's every shape is reserved in reserve_sample: `local` returns the per-CPU slot before them.
LOCAL_SLOT = (
    """\
	__u32 slot = 0;

	return bpf_map_lookup_elem(&bench_local_record, &slot);
"""
    + RESERVE
)
LOCAL_MAP = """\
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8[1024]); /* a record and whatever follows it */
} bench_local_record SEC(".maps");

"""
SUBMIT = "\tsubmit_record(hs, rec);\n}\n"
LOCAL_SUBMIT = "\thop_count(hs, HOPTRACE_C_RECORDED, 1);\n}\n"


# `floor_other`: a filter on the destination port, and nothing else; a match is counted so that the
# compare stays in the program.
OTHER_FLOOR_SOURCE = """\
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct frame {
	struct ethhdr eth;
	struct iphdr ip; /* options-free: the floor does not walk them */
	struct udphdr udp;
} __attribute__((packed));

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} matched SEC(".maps");

static __always_inline int udp_over_ipv4(const struct frame *f, const void *end)
{
	if ((const void *)(f + 1) > end)
		return 0;
	return f->eth.h_proto == bpf_htons(0x0800) && f->ip.ihl == 5 && f->ip.protocol == IPPROTO_UDP;
}

SEC("tc") int floor_other(struct __sk_buff *skb)
{
	const void *data = (const void *)(long)skb->data, *end = (const void *)(long)skb->data_end;
	const struct frame *f = data;
	__u32 key = 0;
	__u64 *n;

	if (!udp_over_ipv4(f, end))
		return -1;
	if (f->udp.dest == bpf_htons(4789)) { /* VXLAN: the flow's headers are inside, after 8 bytes */
		f = data + sizeof(*f) + 8;
		if (!udp_over_ipv4(f, end))
			return -1;
	}
	if (f->udp.dest == bpf_htons(FILTER_PORT) && (n = bpf_map_lookup_elem(&matched, &key)))
		*n += 1;
	return -1;
}

char LICENSE[] SEC("license") = "GPL";
"""


def build_local_object(workdir: Path) -> Path:
    """The hop object with the record written to a per-CPU slot (LOCAL_SLOT), built as `make bpf` does."""
    anchor = "static __always_inline struct hoptrace_record *reserve_sample("
    patches = [(RESERVE, LOCAL_SLOT), (SUBMIT, LOCAL_SUBMIT), (anchor, LOCAL_MAP + anchor)]
    return build_patched_object(workdir, "local", patches)


def build_patched_object(workdir: Path, variant: str, patches: list[tuple[str, str]]) -> Path:
    """The hop object built as `make bpf` does from a copy of kernel-patch/ whose hop.bpf.h has each
    (old, new) of `patches` applied; `old` must occur exactly once."""
    src = workdir / f"kernel-patch-{variant}"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "kernel-patch", src, ignore=shutil.ignore_patterns("build"))
    header = src / "include" / "hop.bpf.h"
    text = header.read_text()
    for old, new in patches:
        if text.count(old) != 1:
            raise RuntimeError(f"hop.bpf.h changed: the {variant} variant's patch no longer applies: {old!r}")
        text = text.replace(old, new)
    header.write_text(text)
    return build_bpf(src / "hoptrace.bpf.c", src / "include", workdir / f"hoptrace-{variant}.bpf.o")


# The slot of a benchmark agent's one trace (tracer.Manager gives its first trace slot 1): the floors'
# records carry it (TRACE_SLOT), so the agent ships them as it ships its hops'; under a slot no trace
# holds it would count them unrouted and drop them.
AGENT_TRACE_SLOT = 1


def build_bpf(source: Path, include: Path, obj: Path, *defines: str) -> Path:
    """`source` built as `make bpf` builds kernel-patch/: this tree's vmlinux.h, headers from `include`,
    TRACE_SLOT defined."""
    subprocess.run(
        ["clang", "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-D__TARGET_ARCH_x86", *defines,
         f"-DTRACE_SLOT={AGENT_TRACE_SLOT}",
         f"-I{REPO / 'kernel-patch' / 'build'}", f"-I{include}", "-c", str(source), "-o", str(obj)],
        check=True,
    )  # fmt: skip
    return obj


def build_floor_object(workdir: Path, name: str) -> Path:
    """FLOOR_SOURCE, built against the project's vmlinux.h and hoptrace.h; `floor_local` with FLOOR_LOCAL;
    `floor_other`: OTHER_FLOOR_SOURCE, filtering on OTHER_PORT."""
    if name == "floor_other":
        src = workdir / "floor_other.bpf.c"
        src.write_text(OTHER_FLOOR_SOURCE)
        obj = workdir / f"{name}.bpf.o"
        return build_bpf(src, REPO / "kernel-patch" / "include", obj, f"-DFILTER_PORT={OTHER_PORT}")
    src = workdir / "floor.bpf.c"
    src.write_text(FLOOR_SOURCE)
    local = ["-DFLOOR_LOCAL"] if name == "floor_local" else []
    return build_bpf(src, REPO / "kernel-patch" / "include", workdir / f"{name}.bpf.o", *local)


def records_map_id(pid: int) -> int:
    """The id of the records ring the agent `pid` holds."""
    held = {m for p in progs_of({pid}).values() for m in p.get("map_ids", [])}
    maps = bpftool_json("map", "show")
    # the name agent/internal/loader.NewRecords gives the ring it creates
    found = [m["id"] for m in maps if m["id"] in held and m.get("name") == "ht_records"]
    if len(found) != 1:
        raise RuntimeError(f"agent {pid}: expected one records map, found {found}")
    return found[0]


@contextlib.contextmanager
def programs_instead(
    topo: TwoHostTopology, ids: dict[str, int], pinned: dict[str, Path]
) -> Iterator[dict[str, int]]:
    """At each hop of `pinned`, the agent's tcx link detached and the pinned program attached with clsact
    instead; yields hop -> the program id running there. The qdiscs are removed after (the agents then
    close their detached links as usual)."""
    links = bpftool_json("link", "show")
    running = dict(ids)
    try:
        for hop, path in pinned.items():
            role, dev, direction = TC_HOPS[hop]
            link = [lk["id"] for lk in links if lk.get("prog_id") == ids[hop]]
            if len(link) != 1:
                raise RuntimeError(f"{hop}: expected one link of program {ids[hop]}, found {link}")
            subprocess.run(["bpftool", "link", "detach", "id", str(link[0])], check=True)
            subprocess.run(["tc", "-n", topo.netns(role), "qdisc", "add", "dev", dev, "clsact"], check=True)
            # nsenter, not `tc -n`: that mounts a sysfs of its own, where /sys/fs/bpf is empty
            subprocess.run(
                ["nsenter", f"--net={topo.netns_path(role)}",
                 "tc", "filter", "add", "dev", dev, direction, "bpf", "da", "pinned", str(path)],
                check=True,
            )  # fmt: skip
            running[hop] = bpftool_json("prog", "show", "pinned", str(path))["id"]
        yield running
    finally:
        for hop in pinned:
            role, dev, _ = TC_HOPS[hop]
            subprocess.run(
                ["tc", "-n", topo.netns(role), "qdisc", "del", "dev", dev, "clsact"],
                check=False,
                capture_output=True,
            )


def recording_ns_per_run(
    ids: dict[str, int], before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> float | None:
    """The recording hops' run time over their runs from `before` to `after` (prog_stats), each program
    once."""
    ns = runs = 0
    for prog in {ids[hop]: hop for hop in RECORDING}.values():
        ns += after[prog][0] - before[prog][0]
        runs += after[prog][1] - before[prog][1]
    return ns / runs if runs else None


def timed(ids: dict[str, int], topo: TwoHostTopology, pinned: bool, seconds: int) -> float | None:
    """The traffic for `seconds`, and the recording hops' ns per run meanwhile."""
    before = prog_stats(ids)
    hop_run_times(ids, topo, seconds, MPS, pinned)
    return recording_ns_per_run(ids, before, prog_stats(ids))


def pin_program(prog_id: int, path: Path) -> Path:
    """`bpftool prog pin`: a path tc can attach the program from."""
    subprocess.run(["bpftool", "prog", "pin", "id", str(prog_id), str(path)], check=True)
    return path


def load_floor(floor: Path, records_id: int | None, path: Path) -> Path:
    """The floor program loaded, with the agent's ring as its records map if it has one, pinned at `path`."""
    ring = ["map", "name", "records", "id", str(records_id)] if records_id is not None else []
    subprocess.run(
        ["bpftool", "prog", "load", str(floor), str(path), "type", "classifier", *ring], check=True
    )
    return path


def measure(
    topo: TwoHostTopology,
    sink: RecordSink,
    workdir: Path,
    condition: str,
    objects: dict[str, Path],
    seconds: int = SECONDS,
) -> float | None:
    """One condition's ns per run of the recording tc hops, over `seconds` of traffic."""
    pinned = condition.endswith("_pin")
    base = condition.removesuffix("_pin")
    if base == "empty":
        with empty_tc_programs(topo, workdir) as ids:
            return timed(ids, topo, pinned, seconds)
    port = OTHER_PORT if base in ("other", "floor_other") else SOCKPERF_PORT
    filter_ = {"protocol": "udp", "dst": topo.addr("c2"), "dstPort": port}
    plans = path_plans(topo, f"ringcost-{condition}", filter_)
    if base == "local":
        for plan in plans:
            plan["objectPath"] = str(objects["local"])
    ring = RINGS.get(base, RINGS["ring"])
    pins: list[Path] = []
    pin_dir = Path("/sys/fs/bpf") / workdir.name  # programs are pinned in bpffs only
    try:
        with path_agents(topo, sink.addr, workdir, plans, "--ringbuf-bytes", str(ring)) as (a, b):
            ids = hop_prog_ids(topo, {"host-a": a.pid, "host-b": b.pid})
            instead: dict[str, Path] = {}
            if base.startswith("floor"):
                for node, pid in (("host-a", a.pid), ("host-b", b.pid)):
                    pin_dir.mkdir(exist_ok=True)
                    path = pin_dir / f"floor-{node}"
                    ring_id = None if base == "floor_other" else records_map_id(pid)
                    pins.append(load_floor(objects[base], ring_id, path))
                    instead |= {hop: path for hop in RECORDING if hop.startswith(node[-1] + "-")}
            elif base == "shared":
                for first, others in SHARED.items():
                    pin_dir.mkdir(exist_ok=True)
                    path = pin_program(ids[first], pin_dir / f"shared-{first}")
                    pins.append(path)
                    instead |= {hop: path for hop in others}
            with programs_instead(topo, ids, instead) as running:
                records = sink.count()
                ns = timed(running, topo, pinned, seconds)
            log(f"ring_cost {condition}: {sink.count() - records} records")
            return ns
    finally:
        for path in pins:
            path.unlink(missing_ok=True)
        if pin_dir.exists():
            pin_dir.rmdir()


def build_objects(workdir: Path, bases: set[str]) -> dict[str, Path]:
    """The objects of the conditions `bases` (without _pin) that run one built here: `local`, the floors."""
    objects = {"local": build_local_object(workdir)} if "local" in bases else {}
    for name in ("floor", "floor_local", "floor_other"):
        if name in bases:
            objects[name] = build_floor_object(workdir, name)
    return objects


def run(rounds: int, conditions: list[str], seconds: int = SECONDS) -> dict[str, list[float]]:
    """Each condition's ns per run over `seconds` of traffic, one per round (order rotated per round)."""
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-ring-cost-"))
    objects = build_objects(workdir, {condition.removesuffix("_pin") for condition in conditions})
    results: dict[str, list[float]] = {c: [] for c in conditions}
    sink = RecordSink()
    topo = TwoHostTopology("hrc", overlay="vxlan")
    try:
        topo.create()
        with bpf_stats_enabled():
            for r in range(rounds):
                order = conditions[r % len(conditions) :] + conditions[: r % len(conditions)]
                for condition in order:
                    ns = measure(topo, sink, workdir, condition, objects, seconds)
                    if ns is not None:
                        results[condition].append(ns)
                    log(
                        f"ring_cost round {r}: {condition} {ns:.0f} ns per run"
                        if ns
                        else f"{condition}: none"
                    )
    finally:
        topo.destroy()
        sink.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--conditions",
        default="ring,ring1M,ring128M,ring_pin,local,local_pin,empty,empty_pin,floor,floor_local,shared,"
        "other,floor_other",
    )
    ap.add_argument("--seconds", type=int, default=SECONDS, help=f"traffic per condition (default {SECONDS})")
    args = ap.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    for name in conditions:
        if name.removesuffix("_pin") not in CONDITIONS:
            ap.error(f"unknown condition {name!r} (known: {', '.join(CONDITIONS)}, each also with _pin)")
    results = run(args.rounds, conditions, args.seconds)
    print("| condition | ns per run, recording tc hops (median over rounds) | rounds |")
    print("|---|---|---|")
    for name, values in results.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"| `{name}` | {median(values):.0f} | {shown} |" if values else f"| `{name}` | none | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
