"""Compile a checked trace spec (`hoptrace.spec.CheckedSpec`: the spec and each hop's parsed attach point)
into one `TracePlan` per node, each with a CO-RE object holding only the programs that node needs.

The per-node C is generated: it includes the hop library (kernel-patch/include/hop.bpf.h) and instantiates
the needed programs under the same names as the generic object (kernel-patch/hoptrace.bpf.c), so the agent
loads either the same way. Objects depend only on the set of programs, not on the trace (every per-trace
setting is a load-time constant), so they are cached by content hash and a new apply rarely runs clang.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from hoptrace import kernel_abi
from hoptrace.common.timeouts import scaled
from hoptrace.spec import AttachPoint, CheckedSpec, tcp_tagging_enabled, udp_tagging_enabled
from hoptrace.spec.actions import FIELD_NUMBERS
from hoptrace.spec.drops import DROP_FUNCTION_FIELD, DROP_REASON_FIELD, drop_hops
from hoptrace.spec.events import CPU_KEY, function_source, latency_since
from hoptrace.spec.workloads import attach_netns
from hoptrace.v1 import agent_pb2, counters_pb2, trace_pb2

log = logging.getLogger(__name__)

# The program (ELF function name) each attach kind's hops run. The program names and sections themselves
# are hop.bpf.h's (generated into hoptrace.kernel_abi.PROGRAMS by `make vocab`).
PROGRAM_FOR_KIND = {
    "tc": "hop_tc",
    "xdp": "hop_xdp",
    "tp_btf": "hop_tp_btf",
    "cgroup_skb": "hop_cgroup_skb",
    "fentry": "hop_fentry",
    "kprobe": "hop_kprobe",
    # The packet at a kernel function's return: fexit sees the arguments; a kretprobe's entry kprobe
    # (hop_kretprobe_entry, in the same macro) keeps the skb for it.
    "fexit": "hop_fexit",
    "kretprobe": "hop_kretprobe",
    "uprobe": "hop_uprobe",  # uprobe: and uretprobe: (the agent attaches it either way)
}
# net:net_dev_xmit fires after a veth handed the skb to its peer: its own program matches the event's dev
# argument instead of skb->dev (kernel-patch/include/hop.bpf.h).
XMIT_TRACEPOINT_PROGRAM = "hop_tp_btf_xmit"
# skb:kfree_skb with its reason argument (from 5.17): only for a hop that reads the drop_reason field, so
# kfree_skb hops without it still load on older kernels.
KFREE_TRACEPOINT_PROGRAM = "hop_tp_btf_kfree"
TCP_TAGGER_PROGRAM = "tag_tcp"
# Events: the tracepoint program, and kernel-function events' (kprobe: FUNCTION, fentry: FUNCTION) programs
# and attach kinds.
EVENT_PROGRAM = "event_tp"
FUNCTION_PROGRAMS = {"kprobe": "event_kprobe", "fentry": "event_fentry"}
EVENT_PROGRAMS = (EVENT_PROGRAM, *FUNCTION_PROGRAMS.values())
FUNCTION_KINDS = {"kprobe": trace_pb2.ATTACH_KIND_KPROBE, "fentry": trace_pb2.ATTACH_KIND_FENTRY}
# socket-read hops, by the filter's protocol. hop_sock_read_udp's macro also defines the queue pair
# (hop_sock_read_udp_queue, hop_sock_read_udp_enqueue) the agent runs instead on kernels from 6.6.
SOCKET_READ_PROGRAMS = {"udp": "hop_sock_read_udp", "tcp": "hop_sock_read_tcp"}
SOCKET_READ_UDP_QUEUE_PROGRAMS = ("hop_sock_read_udp_queue", "hop_sock_read_udp_enqueue")
# hop_kretprobe's macro also defines its entry kprobe, which the agent attaches beside it.
KRETPROBE_ENTRY_PROGRAM = "hop_kretprobe_entry"
# ELF section of each program in the objects, and the order of programs in a generated source.
PROGRAM_SECTIONS: dict[str, str] = dict(kernel_abi.PROGRAMS)
# Path discovery's programs (kernel-patch/include/discover.bpf.h) are no hops: the agent's discover preset
# loads them from the generic object, never from a per-node object.
DISCOVERY_PROGRAMS = ("discover_queue", "discover_recv")
ALL_PROGRAMS = tuple(program for program in PROGRAM_SECTIONS if program not in DISCOVERY_PROGRAMS)


def program_macro(program: str) -> str:
    """The macro of hop.bpf.h that defines `program` under its name and section (hop_tc: HOPTRACE_PROG_TC)."""
    return "HOPTRACE_PROG_" + program.removeprefix("hop_").upper()


# The same includes as kernel-patch/hoptrace.bpf.c, so hop.bpf.h sees what it expects.
SOURCE_PREAMBLE = (
    '#include "vmlinux.h"',
    "#include <bpf/bpf_helpers.h>",
    "#include <bpf/bpf_core_read.h>",
    "#include <bpf/bpf_endian.h>",
    "#include <bpf/bpf_tracing.h>",
    "",
    '#include "hop.bpf.h"',
    "",
)
# The event program's library (it includes hop.bpf.h), only in objects that have the event program.
EVENT_INCLUDE = '#include "event.bpf.h"'

CLANG_FLAGS = ("-O2", "-g", "-Wall", "-target", "bpf", "-D__TARGET_ARCH_x86")
CLANG_TIMEOUT_S = 120  # one per-node object, before HOPTRACE_TIMEOUT_SCALE
REPO_ROOT = Path(__file__).resolve().parent.parent


class CompileError(RuntimeError):
    """clang (or the toolchain around it) failed; the message holds the compiler's own words."""


def program_for_point(point: AttachPoint, protocol: str = "", reads_drop_reason: bool = False) -> str:
    """The program the agent attaches for a parsed attach point (socket-read: per the filter's protocol;
    skb:kfree_skb: its own program when the hop reads drop_reason)."""
    if point.kind == "tp_btf" and point.target == "net_dev_xmit":
        return XMIT_TRACEPOINT_PROGRAM
    if point.kind == "tp_btf" and point.target == "kfree_skb" and reads_drop_reason:
        return KFREE_TRACEPOINT_PROGRAM
    if point.kind == "socket_read":
        return SOCKET_READ_PROGRAMS[protocol]
    return PROGRAM_FOR_KIND[point.kind]


def programs_for_plan(plan: agent_pb2.TracePlan) -> tuple[str, ...]:
    """The programs a node's object must contain for `plan`, in ALL_PROGRAMS order."""
    needed = {hop.program for hop in plan.hops} | {event.program for event in plan.events}
    if plan.HasField("tcp_tagging"):
        needed.add(plan.tcp_tagging.program)
    return tuple(program for program in ALL_PROGRAMS if program in needed)


_IP_PROTOCOLS = {"": 0, "tcp": 6, "udp": 17}


def _network_bytes(text: str) -> tuple[int, bytes, bytes]:
    """(family, masked network-order address, mask) of a validated address or CIDR; an IPv4-mapped IPv6
    address is the IPv4 packet it stands for."""
    network = ipaddress.ip_network(text, strict=False)
    if (
        isinstance(network, ipaddress.IPv6Network)
        and network.network_address.ipv4_mapped
        and network.prefixlen >= 96
    ):
        network = ipaddress.ip_network(f"{network.network_address.ipv4_mapped}/{network.prefixlen - 96}")
    return network.version, network.network_address.packed, network.netmask.packed


def flow_match(flt: trace_pb2.Filter) -> agent_pb2.FlowMatch:
    """A validated spec filter as the BPF programs compare it: the agent never parses the user's strings."""
    match = agent_pb2.FlowMatch(
        ip_proto=_IP_PROTOCOLS[flt.protocol], src_port=flt.src_port, dst_port=flt.dst_port
    )
    if flt.src:
        match.family, match.src_addr, match.src_mask = _network_bytes(flt.src)
    if flt.dst:
        match.family, match.dst_addr, match.dst_mask = _network_bytes(flt.dst)
    return match


def hop_actions(hops: Sequence[trace_pb2.HopSpec]) -> dict[int, agent_pb2.HopActions]:
    """Each hop's typed HopActions, by index: count and histogram as written, and prev_ts on every hop
    before a latency histogram on the same node, so that hop finds the packet's previous timestamp."""
    out: dict[int, agent_pb2.HopActions] = {}
    latency_after: dict[str, int] = {}  # node -> index of the last hop there with a latency histogram
    for index, hop in enumerate(hops):
        actions = agent_pb2.HopActions()
        for action in hop.actions:
            if action.kind == "count":
                actions.count = True
                actions.count_by = FIELD_NUMBERS.get(action.by, 0)
            elif action.kind == "record":
                actions.record.extend(FIELD_NUMBERS.get(name, 0) for name in action.fields)
            elif action.kind == "capture":
                actions.capture = action.bytes
            elif action.kind == "histogram":
                actions.histogram = FIELD_NUMBERS.get(action.field, 0)
                if action.field == "latency":
                    latency_after[hop.node] = index
        out[index] = actions
    for index, hop in enumerate(hops):
        if index < latency_after.get(hop.node, -1):
            out[index].prev_ts = True
    return out


def refused_action_fields(
    hops: Sequence[trace_pb2.HopSpec], hop_index: int, refused: agent_pb2.HopActions
) -> list[str]:
    """The spec fields (``hops[i].actions[j]``) of the actions an agent reports its kernel's verifier refused
    on hop `hop_index`: the inverse of `hop_actions`. A refused prev_ts is the timestamp this hop keeps for
    the latency histogram of a later hop on its node, so it names that histogram."""
    if not 0 <= hop_index < len(hops):
        return []
    fields = []
    for position, action in enumerate(hops[hop_index].actions):
        if (
            (action.kind == "count" and refused.count)
            or (action.kind == "histogram" and refused.histogram)
            or (action.kind == "record" and refused.record)
            or (action.kind == "capture" and refused.capture)
        ):
            fields.append(f"hops[{hop_index}].actions[{position}]")
    if refused.prev_ts:
        node = hops[hop_index].node
        for later in range(len(hops) - 1, hop_index, -1):
            if hops[later].node != node:
                continue
            for position, action in enumerate(hops[later].actions):
                if action.kind == "histogram" and action.field == "latency":
                    fields.append(f"hops[{later}].actions[{position}]")
                    break
            else:
                continue
            break
    return fields


def reads_field(actions: agent_pb2.HopActions | None, name: str) -> bool:
    """Does a hop with these typed actions read field `name` (count by or histogram)?"""
    if actions is None:
        return False
    number = FIELD_NUMBERS[name]
    return (
        (actions.count and actions.count_by == number)
        or actions.histogram == number
        or number in actions.record
    )


def hop_attach(
    hop: trace_pb2.HopSpec,
    point: AttachPoint,
    index: int,
    tag_udp: bool = False,
    actions: agent_pb2.HopActions | None = None,
    protocol: str = "",
) -> agent_pb2.HopAttach:
    """One checked hop, at its parsed attach point, as its node's agent attaches it: typed kind and target,
    the program to run, and its actions (typed: `hop_actions`)."""
    attach = agent_pb2.HopAttach(
        hop_index=index,
        name=hop.name,
        kind=point.attach,
        program=program_for_point(point, protocol, reads_field(actions, "drop_reason")),
        dev=hop.dev,
        netns=attach_netns(hop),
        cgroup=hop.cgroup,
        tag_udp=tag_udp,
    )
    if actions is not None and actions.ByteSize():
        attach.actions.CopyFrom(actions)
    if point.kind == "tp_btf":
        attach.tracepoint_group, attach.tracepoint_event = point.group, point.target
    elif point.kind == "uprobe":
        attach.binary, attach.function = point.binary, point.target
    elif point.target:
        attach.function = point.target
    return attach


def drop_hop_attach(drop: trace_pb2.DropHop) -> agent_pb2.HopAttach:
    """A drop hop (``drops: true``) as its node's agent attaches it: skb:kfree_skb in its namespace, any
    device, recording the reason and the freeing function (its address, which the agent names) of each of
    the trace's packets the kernel drops there. Only packets with the trace's ID are recorded (hop_finish),
    so the hop costs the node's other drops a filter miss."""
    return agent_pb2.HopAttach(
        hop_index=drop.hop_index,
        name=drop.name,
        kind=trace_pb2.ATTACH_KIND_TRACEPOINT,
        program=KFREE_TRACEPOINT_PROGRAM,
        netns=drop.netns,
        tracepoint_group="skb",
        tracepoint_event="kfree_skb",
        actions=agent_pb2.HopActions(
            record=[FIELD_NUMBERS[DROP_REASON_FIELD], FIELD_NUMBERS[DROP_FUNCTION_FIELD]]
        ),
    )


def event_attach(event: trace_pb2.EventSpec, index: int, spec: trace_pb2.TraceSpec) -> agent_pb2.EventAttach:
    """One validated event as its node's agent loads it: typed terms, count key, histogram argument,
    recorded arguments, and the pairing of latencies (this event marks its time when a later event of
    `spec` measures since it)."""
    attach = agent_pb2.EventAttach(event_index=index, name=event.name, program=EVENT_PROGRAM)
    function = function_source(event)
    if function is not None:
        attach.kind, attach.function = FUNCTION_KINDS[function[0]], function[1]
        attach.program = FUNCTION_PROGRAMS[function[0]]
    else:
        attach.tracepoint_group, attach.tracepoint_event = event.tracepoint.split(":", 1)
    attach.where.extend(event.where)
    actions = list(event.actions) or [trace_pb2.ActionSpec(kind="count")]
    for action in actions:
        if action.kind == "count":
            attach.count = True
            if action.by == CPU_KEY:
                attach.count_by = counters_pb2.EVENT_KEY_CPU
            elif action.by:
                attach.count_by, attach.count_by_arg = counters_pb2.EVENT_KEY_ARG, action.by
        elif action.kind == "histogram" and action.since:
            attach.latency_arg = event.key
            attach.latency_since = next(
                i for i, other in enumerate(spec.events) if other.name == action.since
            )
        elif action.kind == "histogram":
            attach.histogram_arg = action.field
        elif action.kind == "record":
            attach.record_args.extend(action.fields)
    if any(latency_since(other) == event.name for other in spec.events):
        attach.mark_arg = event.key
    return attach


def build_plans(checked: CheckedSpec, generation: int, origin: int = 0) -> dict[str, agent_pb2.TracePlan]:
    """Split a checked spec into per-node plans (without objects), keyed by node, in path order.

    Hops and events keep their global index. UDP: the first hop writes IDs (tag_udp). TCP: the first hop's
    node tags the segments its sockets send in the first hop's netns (sock_ops); a cgroup-egress first hop
    narrows the sock_ops attachment to its cgroup. Events go to their nodes' plans (maybe events alone).
    `origin`: the trace's ID origin (1..TRACE_ORIGINS), by which every hop also follows its packets
    through address translations; 0 for plans without one (standalone: the filter alone decides).
    """
    spec, points = checked.spec, checked.points
    plans: dict[str, agent_pb2.TracePlan] = {}
    match = flow_match(spec.filter)
    actions = hop_actions(spec.hops)
    for index, (hop, point) in enumerate(zip(spec.hops, points, strict=True)):
        plan = plans.get(hop.node)
        if plan is None:
            plan = plans[hop.node] = agent_pb2.TracePlan(
                trace=spec.name, generation=generation, sample=spec.sample or 1, id_origin=origin
            )
            plan.match.CopyFrom(match)
        plan.hops.append(
            hop_attach(
                hop,
                point,
                index,
                tag_udp=index == 0 and udp_tagging_enabled(spec),
                actions=actions[index],
                protocol=spec.filter.protocol,
            )
        )
    # Resolved at validation against the agents (with their kernels' reason names); a spec checked without
    # agents (standalone plans) gets the same hops here.
    for drop in spec.drop_hops or drop_hops(spec):
        plans[drop.node].hops.append(drop_hop_attach(drop))
    for index, event in enumerate(spec.events):
        plan = plans.get(event.node)
        if plan is None:
            plan = plans[event.node] = agent_pb2.TracePlan(
                trace=spec.name, generation=generation, sample=spec.sample or 1, id_origin=origin
            )
            plan.match.CopyFrom(match)
        plan.events.append(event_attach(event, index, spec))
    if spec.hops and tcp_tagging_enabled(spec):
        first = spec.hops[0]
        cgroup = first.cgroup if points[0].attach == trace_pb2.ATTACH_KIND_CGROUP_EGRESS else ""
        plans[first.node].tcp_tagging.CopyFrom(
            agent_pb2.TcpTagging(netns=attach_netns(first), cgroup=cgroup, program=TCP_TAGGER_PROGRAM)
        )
    return plans


def standalone_plans(
    checked: CheckedSpec, object_path: str | Path, generation: int = 1
) -> dict[str, dict[str, Any]]:
    """Per-node plans of a checked spec for standalone agents (``hoptrace-agent run --plan FILE``), as
    protojson dicts that name an object file instead of carrying one."""
    plans = build_plans(checked, generation)
    for plan in plans.values():
        plan.object_path = str(object_path)
    return {node: json_format.MessageToDict(plan) for node, plan in plans.items()}


@dataclass(frozen=True)
class Toolchain:
    """Where the BPF sources and headers are, and which clang to run."""

    kernel_patch_dir: Path
    build_dir: Path
    clang: str = "clang"

    @classmethod
    def default(cls) -> Toolchain:
        """kernel-patch/ of this checkout (override with HOPTRACE_KERNEL_PATCH_DIR and HOPTRACE_CLANG)."""
        kernel_patch = Path(os.environ.get("HOPTRACE_KERNEL_PATCH_DIR", REPO_ROOT / "kernel-patch"))
        return cls(kernel_patch, kernel_patch / "build", os.environ.get("HOPTRACE_CLANG", "clang"))

    @property
    def include_dir(self) -> Path:
        return self.kernel_patch_dir / "include"


def generate_source(programs: Iterable[str], kernel_patch_dir: Path) -> str:
    """The per-node C file defining only `programs`, with the macros of kernel-patch/include/hop.bpf.h.

    Falls back to the generic object's source (every program) when hop.bpf.h lacks a program's macro.
    """
    programs = list(programs)
    library_text = "".join(
        library.read_text(errors="replace")
        for library in (kernel_patch_dir / "include" / name for name in ("hop.bpf.h", "event.bpf.h"))
        if library.exists()
    )
    lines = ["/* Generated by hoptrace.dispatcher.compile: the programs one node needs. */"]
    if all(f"#define {program_macro(program)}" in library_text for program in programs):
        lines.extend(SOURCE_PREAMBLE)
        if any(program in programs for program in EVENT_PROGRAMS):
            lines[-1:] = [EVENT_INCLUDE, ""]
        lines.extend(program_macro(program) for program in programs)
        lines.extend(("", 'char LICENSE[] SEC("license") = "Dual BSD/GPL";'))
    else:
        lines.append("/* hop.bpf.h lacks a program macro: the generic object, every program. */")
        lines.append('#include "hoptrace.bpf.c"')
    return "\n".join(lines) + "\n"


class BpfCompiler:
    """Compiles per-node objects with clang, caching them by the hash of everything that goes in."""

    def __init__(self, toolchain: Toolchain | None = None, cache_dir: Path | None = None) -> None:
        self.toolchain = toolchain or Toolchain.default()
        self.cache_dir = cache_dir
        self._memory_cache: dict[str, bytes] = {}
        self.clang_runs = 0  # objects actually compiled (not from a cache)
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._file_hashes: dict[tuple[str, int, int], str] = {}
        self._pch_lock = threading.Lock()
        self._pch_paths: dict[str, Path | None] = {}

    @property
    def _work_dir(self) -> Path:
        return self.cache_dir or Path(tempfile.gettempdir()) / "hoptrace-bpf-cache"

    def _precompiled_header(self, vmlinux_dir: Path) -> Path | None:
        """vmlinux.h and the libbpf headers precompiled once (clang -x c-header): parsing vmlinux.h is most
        of a compile's time. None when clang cannot build it; compiles then parse the headers themselves."""
        header_text = "\n".join(line for line in SOURCE_PREAMBLE if ".bpf.h" not in line) + "\n"
        vmlinux = vmlinux_dir / "vmlinux.h"
        # clang refuses a PCH whose headers changed on disk (mtime included), so the key has the mtime too.
        key_text = "|".join(
            (header_text, self.toolchain.clang, *CLANG_FLAGS, str(vmlinux), str(vmlinux.stat().st_mtime_ns))
        )
        key = hashlib.sha256(f"{key_text}|{self._file_digest(vmlinux)}".encode()).hexdigest()[:24]
        with self._pch_lock:
            if key in self._pch_paths:
                return self._pch_paths[key]
            header = self._work_dir / f"preamble-{key}.h"
            pch = header.with_suffix(".h.pch")
            if not pch.exists():
                header.parent.mkdir(parents=True, exist_ok=True)
                if not header.exists():  # the PCH refers to this file: it must stay, unchanged
                    partial_header = header.with_suffix(f".{os.getpid()}.tmp")
                    partial_header.write_text(header_text)
                    partial_header.replace(header)
                partial = pch.with_suffix(f".{os.getpid()}.tmp")
                command = [self.toolchain.clang, *CLANG_FLAGS, f"-I{vmlinux_dir}", "-x", "c-header"]
                command += [str(header), "-o", str(partial)]
                try:
                    result = subprocess.run(command, capture_output=True, text=True, check=False)
                except FileNotFoundError:
                    result = None
                if result is None or result.returncode != 0:
                    log.warning("no precompiled header: %s", result.stderr.strip() if result else "no clang")
                    partial.unlink(missing_ok=True)
                    self._pch_paths[key] = None
                    return None
                partial.replace(pch)
            self._pch_paths[key] = pch
            return pch

    def warm_up(self) -> None:
        """Prepare vmlinux.h and the precompiled header now so the first apply is fast; errors are logged."""
        try:
            self._precompiled_header(self._vmlinux_dir())
        except CompileError as error:
            log.warning("BPF toolchain not ready: %s", error)

    def _file_digest(self, path: Path) -> str:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        digest = self._file_hashes.get(key)
        if digest is None:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            self._file_hashes[key] = digest
        return digest

    def _vmlinux_dir(self) -> Path:
        """The directory with vmlinux.h: kernel-patch/build, else one generated from this kernel's BTF."""
        if (self.toolchain.build_dir / "vmlinux.h").exists():
            return self.toolchain.build_dir
        generated_dir = self._work_dir / "vmlinux"
        target = generated_dir / "vmlinux.h"
        if target.exists():
            return generated_dir
        btf = Path("/sys/kernel/btf/vmlinux")
        bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
        if not btf.exists() or not Path(bpftool).exists():
            raise CompileError(
                f"no vmlinux.h in {self.toolchain.build_dir}, and no BTF to generate it: run 'make bpf'"
            )
        generated_dir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [bpftool, "btf", "dump", "file", str(btf), "format", "c"], capture_output=True, check=False
        )
        if result.returncode != 0:
            raise CompileError(f"bpftool btf dump failed: {result.stderr.decode(errors='replace').strip()}")
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(result.stdout)
        partial.replace(target)
        return generated_dir

    def _inputs_digest(self, source: str, vmlinux_dir: Path) -> str:
        digest = hashlib.sha256()
        digest.update(source.encode())
        digest.update(" ".join((self.toolchain.clang, *CLANG_FLAGS)).encode())
        inputs = sorted(self.toolchain.include_dir.glob("*.h")) + [
            self.toolchain.kernel_patch_dir / "hoptrace.bpf.c",
            vmlinux_dir / "vmlinux.h",
        ]
        for path in inputs:
            if path.exists():
                digest.update(f"{path.name}:{self._file_digest(path)}".encode())
        return digest.hexdigest()

    def compile_programs(self, programs: Iterable[str]) -> bytes:
        """The ELF object with `programs` (names from ALL_PROGRAMS); raises CompileError."""
        programs = tuple(programs)
        unknown = [program for program in programs if program not in ALL_PROGRAMS]
        if unknown:
            raise CompileError(f"unknown programs: {', '.join(unknown)}")
        vmlinux_dir = self._vmlinux_dir()
        source = generate_source(programs, self.toolchain.kernel_patch_dir)
        key = self._inputs_digest(source, vmlinux_dir)
        with self._lock:
            if key in self._memory_cache:
                return self._memory_cache[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # two nodes needing the same object compile it once
            if key in self._memory_cache:
                return self._memory_cache[key]
            cached = self.cache_dir / f"{key}.o" if self.cache_dir else None
            if cached is not None and cached.exists():
                elf = cached.read_bytes()
            else:
                elf = self._run_clang(source, vmlinux_dir, programs)
                self.clang_runs += 1
                if cached is not None:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    partial = cached.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                    partial.write_bytes(elf)
                    partial.replace(cached)
            with self._lock:
                self._memory_cache[key] = elf
            return elf

    def _run_clang(self, source: str, vmlinux_dir: Path, programs: tuple[str, ...]) -> bytes:
        with tempfile.TemporaryDirectory(prefix="hoptrace-bpf-") as workdir:
            source_path = Path(workdir) / "node.bpf.c"
            object_path = Path(workdir) / "node.bpf.o"
            source_path.write_text(source)
            pch = self._precompiled_header(vmlinux_dir)
            command = [
                self.toolchain.clang,
                *CLANG_FLAGS,
                f"-I{vmlinux_dir}",
                f"-I{self.toolchain.include_dir}",
                f"-I{self.toolchain.kernel_patch_dir}",
                *(("-include-pch", str(pch)) if pch else ()),
                "-c",
                str(source_path),
                "-o",
                str(object_path),
            ]
            result = self._clang(command)
            pch_refused = "AST file" in result.stderr or "precompiled" in result.stderr
            if result.returncode != 0 and pch and pch_refused:
                log.warning("precompiled header unusable, compiling without it: %s", result.stderr.strip())
                with self._pch_lock:
                    self._pch_paths = {key: None for key in self._pch_paths}
                result = self._clang([arg for arg in command if arg not in ("-include-pch", str(pch))])
            if result.returncode != 0:
                raise CompileError(
                    f"clang failed compiling the object for programs {', '.join(programs) or '(none)'}:\n"
                    + result.stderr.replace(workdir + "/", "").strip()
                )
            if result.stderr.strip():
                log.warning("clang warnings: %s", result.stderr.strip())
            return object_path.read_bytes()

    def _clang(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        # A compile takes seconds here and minutes on a slow machine (a TCG guest): the limit scales.
        limit_s = scaled(CLANG_TIMEOUT_S)
        try:
            return subprocess.run(command, capture_output=True, text=True, check=False, timeout=limit_s)
        except FileNotFoundError:
            raise CompileError(f"{self.toolchain.clang} not found: the dispatcher needs clang") from None
        except subprocess.TimeoutExpired:
            raise CompileError(
                f"clang did not finish within {limit_s:.0f} s (HOPTRACE_TIMEOUT_SCALE stretches this)"
            ) from None

    def compile_plans(self, plans: dict[str, agent_pb2.TracePlan], parallel: int = 4) -> None:
        """Fill each plan's `object`, compiling distinct program sets in parallel; raises CompileError."""
        wanted = {node: programs_for_plan(plan) for node, plan in plans.items()}
        distinct = sorted(set(wanted.values()))
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(distinct)))) as pool:
            objects = dict(zip(distinct, pool.map(self.compile_programs, distinct), strict=True))
        for node, plan in plans.items():
            plan.object = objects[wanted[node]]


def compile_spec(
    checked: CheckedSpec, generation: int, compiler: BpfCompiler, origin: int = 0
) -> dict[str, agent_pb2.TracePlan]:
    """Per-node plans of a checked spec with their objects (build_plans'), keyed by node in path order;
    raises CompileError."""
    plans = build_plans(checked, generation, origin)
    compiler.compile_plans(plans)
    return plans


def elf_sections(elf: bytes) -> list[str]:
    """Section names of an ELF object (64-bit little-endian, as clang -target bpf writes on x86)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF object")
    section_offset = struct.unpack_from("<Q", elf, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, section_offset + i * entry_size) for i in range(count)]
    names_offset = headers[names_index][4]
    names = []
    for name_offset, *_ in headers:
        start = names_offset + name_offset
        names.append(elf[start : elf.index(b"\0", start)].decode())
    return names
