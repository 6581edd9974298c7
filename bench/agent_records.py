"""Agent throughput: records/s from the ring buffer to gRPC, lost records, CPU and RSS of the agent.

Method (the simplest honest one on a 2-core VM): the namespaces cannot carry 500 k packets/s, so the
records are
made by the agent's *own* attached `hop_tc` program run through `BPF_PROG_TEST_RUN`. The standalone agent
runs a
one-hop plan (tc ingress on a veth in a namespace of its own); a load generator (this file with `--loadgen`, a
separate process) opens that program by id (`BPF_PROG_GET_FD_BY_ID`) and runs it on a crafted, already
tagged UDP
frame with `repeat = chunk`, paced to a target rate. Every run writes one 32-byte record into the agent's
one ring
buffer, exactly as a packet on the device would; the agent reads, batches and streams them over gRPC to a
counting
sink (`common.RecordSink`: the collector is measured on its own in `collector.py` and `scale.py`).

Per rate step: records/s delivered, the agent's CPU (utime+stime from /proc/PID/stat, 1.0 = one core),
peak RSS,
`ringbuf_full` (records the program could not reserve: the ring buffer was full) and the agent's queue
drops, both
from its /metrics. The load generator and the BPF program run on one core, the agent and the sink share
the other.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import Any

_SYS_BPF = 321  # x86_64
_BPF_PROG_TEST_RUN = 10
_BPF_PROG_GET_FD_BY_ID = 13
LOAD_PORT = 9999


# ---- the load generator (a separate process) -----------------------------------------------------


class _TestRunAttr(ctypes.Structure):
    """The `test` member of union bpf_attr (include/uapi/linux/bpf.h)."""

    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("_pad", ctypes.c_uint8 * 60),
    ]


class _GetFdAttr(ctypes.Structure):
    _fields_ = [
        ("prog_id", ctypes.c_uint32),
        ("next_id", ctypes.c_uint32),
        ("open_flags", ctypes.c_uint32),
        ("_pad", ctypes.c_uint8 * 116),
    ]


def _checksum(data: bytes) -> int:
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def tagged_udp_frame(packet_id: int = (7 << 24) | 1, payload: int = 64) -> bytes:
    """Ethernet + IPv4 + UDP (dport LOAD_PORT) + payload + the 4-byte hoptrace ID in the UDP surplus area."""
    udp_len = 8 + payload
    ip_len = 20 + udp_len + 4
    src, dst = socket.inet_aton("198.18.9.1"), socket.inet_aton("198.18.9.2")
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, ip_len, 1, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    udp = struct.pack("!HHHH", 40000, LOAD_PORT, udp_len, 0)
    eth = bytes.fromhex("02000000000202000000000108 00".replace(" ", ""))
    return eth + ip + udp + bytes(payload) + struct.pack("!I", packet_id)


def loadgen(prog_id: int, rate: int, seconds: float) -> dict[str, Any]:
    """Run program `prog_id` on a tagged frame `rate` times a second (0 = as fast as possible)."""
    libc = ctypes.CDLL(None, use_errno=True)
    get = _GetFdAttr(prog_id=prog_id)
    fd = libc.syscall(_SYS_BPF, _BPF_PROG_GET_FD_BY_ID, ctypes.byref(get), ctypes.sizeof(get))
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"BPF_PROG_GET_FD_BY_ID {prog_id}")
    frame = tagged_udp_frame()
    buf = ctypes.create_string_buffer(frame, len(frame))
    chunk = 20_000 if rate == 0 else max(500, rate // 200)
    attr = _TestRunAttr(prog_fd=fd, data_size_in=len(frame), data_in=ctypes.addressof(buf), repeat=chunk)
    runs = 0
    start = time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        if rate:
            due = start + runs / rate
            if due > now:
                time.sleep(due - now)
                continue
        if libc.syscall(_SYS_BPF, _BPF_PROG_TEST_RUN, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
            raise OSError(ctypes.get_errno(), "BPF_PROG_TEST_RUN")
        runs += chunk
    os.close(fd)
    return {"runs": runs, "seconds": time.monotonic() - start, "duration_ns_per_run": attr.duration}


# ---- the benchmark -------------------------------------------------------------------------------


def run(ctx: Any) -> dict[str, Any]:
    """Rising record rates through one agent; records/s, losses, CPU, RSS per step."""
    from common import PlanAgent, RecordSink, UsageSampler, log, metric_sum, progs_of, target
    from hoptrace.lab.reference import unchecked_plans
    from hoptrace.spec import spec_from_data

    rates = ctx.size([100_000, 0], [100_000, 250_000, 500_000, 1_000_000, 2_000_000, 0])
    seconds = ctx.size(1.0, 4.0)
    netns = f"{ctx.prefix()}-load"
    sink = RecordSink()
    agent = None
    steps: list[dict[str, Any]] = []
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(
            ["ip", "-n", netns, "link", "add", "ld0", "type", "veth", "peer", "name", "ld1"], check=True
        )
        subprocess.run(["ip", "-n", netns, "link", "set", "ld0", "up"], check=True)
        spec = spec_from_data(
            {
                "name": "agent-records",
                "filter": {"protocol": "udp", "dst_port": LOAD_PORT},
                "hops": [{"name": "load-in", "node": "load", "at": "tc-ingress", "dev": "ld0"}],
            }
        )
        plan = unchecked_plans(spec, ctx_bpf_object())["load"]
        # The load generator's packets carry their IDs already: this ingress hop only records.
        plan["hops"][0].pop("tagUdp", None)
        agent = PlanAgent(plan, "load", netns, sink.addr, ctx.workdir, "--clock-server", "off").start()
        # The trace counts active a moment before Apply returns its load's garbage (10+ MB) to the OS:
        # the first step's peak RSS was the load's in some runs (52 MB at 100 k/s, 40 MB in the others).
        time.sleep(1)
        prog_ids = [p["id"] for p in progs_of({agent.pid}).values() if p.get("name") == "hop_tc"]
        if len(prog_ids) != 1:
            raise RuntimeError(f"expected one hop_tc held by the agent, got {prog_ids}")
        for rate in rates:
            m0, n0 = agent.metrics(), sink.count()
            sampler = UsageSampler(agent.pid, 0.1)
            t0 = time.monotonic()
            gen = subprocess.run(
                [sys.executable, __file__, "--loadgen", str(prog_ids[0]), str(rate), str(seconds)],
                capture_output=True,
                text=True,
                timeout=seconds + 60,
            )
            if gen.returncode != 0:
                raise RuntimeError(f"load generator failed: {gen.stderr[-2000:]}")
            made = json.loads(gen.stdout)
            # wait until the sink stops growing: the agent drained its ring buffer and queue
            last, last_change = sink.count(), time.monotonic()
            while time.monotonic() - last_change < 0.5 and time.monotonic() - t0 < seconds + 30:
                time.sleep(0.05)
                if (now := sink.count()) != last:
                    last, last_change = now, time.monotonic()
            usage = sampler.stop()
            m1 = agent.metrics()
            delivered = sink.count() - n0
            busy = last_change - t0
            ringbuf_full = metric_sum(
                m1, "hoptrace_agent_hop_events_total", counter="ringbuf_full"
            ) - metric_sum(m0, "hoptrace_agent_hop_events_total", counter="ringbuf_full")
            queue_full = metric_sum(
                m1, "hoptrace_agent_records_dropped_total", reason="queue_full"
            ) - metric_sum(m0, "hoptrace_agent_records_dropped_total", reason="queue_full")
            step = {
                "target_rate": rate or "max",
                "offered_per_s": made["runs"] / made["seconds"],
                "made": made["runs"],
                "delivered": delivered,
                "delivered_per_s": delivered / busy if busy > 0 else 0.0,
                "ringbuf_full": int(ringbuf_full),
                "queue_full": int(queue_full),
                "lost": made["runs"] - delivered,
                "agent_cpu_cores": usage["cpu_cores"] * (time.monotonic() - t0) / busy if busy else 0.0,
                "agent_peak_rss_mb": usage["peak_rss_bytes"] / 2**20,
                "bpf_ns_per_run": made["duration_ns_per_run"],
            }
            steps.append(step)
            log(
                f"agent_records {step['target_rate']}: offered {step['offered_per_s'] / 1e3:.0f} k/s, delivered "  # noqa: E501
                f"{step['delivered_per_s'] / 1e3:.0f} k/s, lost {step['lost']} (ringbuf_full {step['ringbuf_full']}), "  # noqa: E501
                f"cpu {step['agent_cpu_cores']:.2f}, rss {step['agent_peak_rss_mb']:.1f} MB"
            )
    finally:
        if agent is not None:
            agent.stop()
        sink.close()
        subprocess.run(["ip", "netns", "del", netns], check=False)

    ceiling = max(s["delivered_per_s"] for s in steps)
    at_500k = next((s for s in steps if s["target_rate"] == 500_000), None)
    # The RSS target is at 1 M records/s; past what the sink takes, the agent's queue holds what waits
    # (up to its 256 MB bound) by design.
    rss_up_to_1m = max(
        s["agent_peak_rss_mb"] for s in steps if s["target_rate"] != "max" and s["target_rate"] <= 1_000_000
    )
    return {
        "seconds_per_step": seconds,
        "steps": steps,
        "summary": {
            "max_records_per_s": ceiling,
            "lost_at_500k": at_500k["lost"] if at_500k else None,
            "peak_rss_mb": max(s["agent_peak_rss_mb"] for s in steps),
            "peak_rss_mb_up_to_1m": rss_up_to_1m,
        },
        "targets": [
            target(
                "agent records/s, ring buffer -> gRPC", ceiling, 1_000_000, "records/s", higher_is_better=True
            ),
            target("records lost at 500 k records/s", at_500k["lost"] if at_500k else None, 0, "records"),
            target("agent RSS up to 1 M records/s", rss_up_to_1m, 50, "MB"),
        ],
        "table": {
            "columns": [
                "target rate",
                "offered/s",
                "delivered/s",
                "lost",
                "ringbuf_full",
                "queue_full",
                "agent CPU (cores)",
                "peak RSS MB",
            ],
            "rows": [
                [
                    s["target_rate"],
                    s["offered_per_s"],
                    s["delivered_per_s"],
                    s["lost"],
                    s["ringbuf_full"],
                    s["queue_full"],
                    s["agent_cpu_cores"],
                    s["agent_peak_rss_mb"],
                ]
                for s in steps
            ],
        },
    }


def ctx_bpf_object() -> str:
    """The generic hop object."""
    from common import BPF_OBJECT

    return str(BPF_OBJECT)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="load generator of the agent benchmark")
    parser.add_argument("--loadgen", nargs=3, metavar=("PROG_ID", "RATE", "SECONDS"), required=True)
    args = parser.parse_args()
    prog, rate_, secs = args.loadgen
    print(json.dumps(loadgen(int(prog), int(rate_), float(secs))))
