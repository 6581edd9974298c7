"""The report's one view: `report_from_proto` turns the API's `Report` into the dict that `hoptrace report
--json` prints and the web shows, and `render_text` into the text table of `hoptrace report`.

JSON shape (a contract):
    {"trace", "packets", "complete",
     "segments": [{"from", "to", "count", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "incomplete",
                   "loss_count", "loss_rate", "tracer_lost", "before_attach", "jitter_ns", "jitter_p99_ns",
                   "same_node", "below_clock_bound", "clock_bound_ns",
                   "drops": [{"node", "reason", "function", "count"}]}],
     "end_to_end": {same keys},
     "hops": [{"hop", "packets_per_s", "bytes_per_s", "counts", "histograms", "recorded", and "container",
               "pod" for a hop named by a workload}],
     "events": [{"name", "node", "count", "count_by", "by", "histogram_arg", "histogram", "latency_missed",
                 "recorded"}],
     "addresses": [{"hop", "protocol", "source", "destination", "packets"}],
     "translations": [{"from", "to", "kind", "before", "after", "packets"}],
     "clock_jumps": [{"node", "jump_ns", "allowed_ns", "at", "segments"}]}
with segments and hops in path order. "addresses" is what each hop saw of the packets that describe their
addresses (one in 64), "translations" where consecutive hops saw them differ (a DNAT, a masquerade):
`translation_text` says one in a line. The numbers are raw: a cross-node latency within its clock bound may
be negative. Readers show it through `latency_text`, which says "≤ ±BOUND" for it, and `most_time_text`
names the segment with the largest p50. A trace with `drops: true` has each segment's lost packets that a
node's kernel dropped in "drops", by node, reason and the kernel function that freed them (most first), which
`loss_text` says in one line.
"clock_jumps" are the path's nodes whose offset moved beyond their bounds within the range (oldest first),
with the cross-node segments at that node, which `clock_jump_text` calls suspect in a note.
"""

from __future__ import annotations

from typing import Any

from hoptrace.results.format import WITHIN_CLOCK_BOUND, format_ns, timestamp_text
from hoptrace.v1 import api_pb2


def _stats_data(stats: api_pb2.SegmentStats) -> dict[str, Any]:
    return {
        "from": getattr(stats, "from"),
        "to": stats.to,
        "count": stats.count,
        "mean_ns": stats.mean_ns,
        "p50_ns": stats.p50_ns,
        "p90_ns": stats.p90_ns,
        "p99_ns": stats.p99_ns,
        "max_ns": stats.max_ns,
        "incomplete": stats.incomplete,
        "loss_count": stats.loss_count,
        "loss_rate": stats.loss_rate,
        "tracer_lost": stats.tracer_lost,
        "before_attach": stats.before_attach,
        "jitter_ns": stats.jitter_ns,
        "jitter_p99_ns": stats.jitter_p99_ns,
        "same_node": stats.same_node,
        "below_clock_bound": stats.below_clock_bound,
        "clock_bound_ns": stats.clock_bound_ns,
        "drops": [
            {"node": d.node, "reason": d.reason, "function": d.function, "count": d.count}
            for d in stats.drops
        ],
    }


def loss_text(segment: dict[str, Any]) -> str:
    """A segment's loss and why, in one line: "lost 12: 9 NETFILTER_DROP on host-b (nft_do_chain),
    3 NO_SOCKET on host-b (__udp4_lib_rcv)", the kernel function that freed them in parentheses (none from
    an older agent), with "N not seen dropped" for lost packets no kernel reported ("lost 0" without loss)."""
    lost = segment.get("loss_count", 0)
    parts = [
        f"{d['count']} {d['reason']} on {d['node']}" + (f" ({d['function']})" if d.get("function") else "")
        for d in segment.get("drops", [])
    ]
    unexplained = lost - sum(d["count"] for d in segment.get("drops", []))
    if parts and unexplained > 0:
        parts.append(f"{unexplained} not seen dropped")
    return f"lost {lost}: " + ", ".join(parts) if parts else f"lost {lost}"


def report_from_proto(report: api_pb2.Report) -> dict[str, Any]:
    """The `hoptrace report --json` dict of a `hoptrace.v1.Report`: what every client shows."""
    return {
        "trace": report.trace,
        "packets": report.packets,
        "complete": report.complete,
        "segments": [_stats_data(segment) for segment in report.segments],
        "end_to_end": _stats_data(report.end_to_end),
        "hops": [
            {
                "hop": h.hop,
                "packets_per_s": h.packets_per_s,
                "bytes_per_s": h.bytes_per_s,
                **({"container": h.container} if h.container else {}),
                **({"pod": h.pod} if h.pod else {}),
                "counts": [
                    {
                        "node": c.node,
                        "by": c.by,
                        "key": c.key,
                        "count": c.count,
                        **({"key_name": c.key_name} if c.key_name else {}),
                    }
                    for c in h.counts
                ],
                "histograms": [
                    {
                        "node": g.node,
                        "field": g.field,
                        "total": g.total,
                        "buckets": [{"le": b.le, "count": b.count} for b in g.buckets],
                    }
                    for g in h.histograms
                ],
                "recorded": [
                    {
                        "node": r.node,
                        "field": r.field,
                        "count": r.count,
                        "min": r.min,
                        "max": r.max,
                        "mean": r.mean,
                        "last": r.last,
                    }
                    for r in h.recorded
                ],
            }
            for h in report.hops
        ],
        "events": [
            {
                "name": e.name,
                "node": e.node,
                "count": e.count,
                "count_by": e.count_by,
                "by": dict(sorted(e.by.items(), key=lambda item: (len(item[0]), item[0]))),
                "histogram_arg": e.histogram_arg,
                "histogram": [{"le": b.le, "count": b.count} for b in e.histogram],
                "latency_missed": e.latency_missed,
                "recorded": [
                    {
                        "arg": r.arg,
                        "count": r.count,
                        "sum": r.sum,
                        "mean": r.mean if r.count else None,
                        **{k: recorded_value(getattr(r, k), r.signed) for k in ("min", "max", "last")},
                        "signed": r.signed,
                    }
                    for r in e.recorded
                ],
            }
            for e in report.events
        ],
        "addresses": [
            {
                "hop": a.hop,
                "protocol": a.protocol,
                "source": a.source,
                "destination": a.destination,
                "packets": a.packets,
            }
            for a in report.addresses
        ],
        "translations": [
            {
                "from": t.from_hop,
                "to": t.to_hop,
                "kind": t.kind,
                "before": t.before,
                "after": t.after,
                "packets": t.packets,
            }
            for t in report.translations
        ],
        "clock_jumps": [
            {
                "node": j.node,
                "jump_ns": j.jump_ns,
                "allowed_ns": j.allowed_ns,
                "at": timestamp_text(j.at),
                "segments": list(j.segments),
            }
            for j in report.clock_jumps
        ],
    }


def clock_jump_text(jump: dict[str, Any]) -> str:
    """A clock jump as the report's note: "clock of host-b jumped by -5.00ms at 2026-...: segments across it
    are suspect: a > b, end to end"."""
    return (
        f"clock of {jump['node']} jumped by {format_ns(jump['jump_ns'])} at {jump['at']} (its bounds allow "
        f"±{format_ns(jump['allowed_ns'])}): segments across it are suspect: " + ", ".join(jump["segments"])
    )


def translation_text(translation: dict[str, Any]) -> str:
    """One translation in a line: "client > node: DNAT 198.18.99.9:8080 -> 198.18.2.2:11111 (12 packets)"."""
    t = translation
    return (
        f"{t['from']} > {t['to']}: {t['kind'].upper()} {t['before']} -> {t['after']} ({t['packets']} packets)"
    )


def addresses_lines(report: dict[str, Any], per_hop: int = 2) -> list[str]:
    """The addresses section of the text report: each hop's most seen tuples, then the translations."""
    lines: list[str] = []
    shown: dict[str, int] = {}
    for a in report.get("addresses", []):
        shown[a["hop"]] = shown.get(a["hop"], 0) + 1
        if shown[a["hop"]] <= per_hop:
            lines.append(
                f"  {a['hop']}: {a['protocol']} {a['source']} > {a['destination']} ({a['packets']} packets)"
            )
    for hop, n in shown.items():
        if n > per_hop:
            lines.append(f"  {hop}: {n - per_hop} more (hoptrace report --json lists them)")
    if not lines:
        return []
    head = ["addresses each hop saw (the packets that describe them, one in 64):", *lines]
    translations = [f"  {translation_text(t)}" for t in report.get("translations", [])]
    if translations:
        head += ["translations (where consecutive hops saw different addresses):", *translations]
    return head


def recorded_value(value: int, signed: bool) -> int:
    """A stored min/max/last of an event's record as the argument's own integer: InfluxDB's integers are
    int64, so an unsigned argument's values are stored as their two's complement bits (tag signed=false)."""
    return value if signed else value % (1 << 64)


LATENCY_FIELDS = ("mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns")


def within_clock_bound(segment: dict[str, Any], value: float) -> bool:
    """True when `value`, one of the segment's latencies, cannot be told from zero: the segment crosses
    nodes and the value is below the sum of their clock bounds (or negative while the bound is unknown)."""
    if segment.get("same_node"):
        return False
    return value < 0 or value < segment.get("clock_bound_ns", 0)


def bound_text(segment: dict[str, Any]) -> str:
    """ "≤ ±170ns": how a latency within the segment's clock bound reads ("≤ ±?" while it is unknown)."""
    bound = segment.get("clock_bound_ns", 0)
    return f"≤ ±{format_ns(bound)}" if bound > 0 else "≤ ±?"


def latency_text(segment: dict[str, Any], field: str) -> str:
    """One latency of a segment (a LATENCY_FIELDS key) as a reader sees it: "3.7us", or "≤ ±170ns" when the
    clocks cannot resolve it (never a negative number)."""
    value = segment[field]
    return bound_text(segment) if within_clock_bound(segment, value) else format_ns(value)


def most_time(report: dict[str, Any]) -> tuple[dict[str, Any], float, float] | None:
    """The segment with the largest p50 and its shares (percent) of the end-to-end p50 and p99; None without
    packets end to end."""
    e2e = report["end_to_end"]
    segments = [s for s in report["segments"] if s["count"] > 0]
    if not segments or e2e["count"] == 0 or e2e["p50_ns"] <= 0 or e2e["p99_ns"] <= 0:
        return None
    top = max(segments, key=lambda s: s["p50_ns"])  # the first in path order on a tie
    return (
        top,
        100 * max(top["p50_ns"], 0) / e2e["p50_ns"],
        100 * max(top["p99_ns"], 0) / e2e["p99_ns"],
    )


def most_time_text(report: dict[str, Any]) -> str | None:
    """ "most time: a > b (62 % of p50, 48 % of p99)": where the time goes, in one line; None without data."""
    found = most_time(report)
    if found is None:
        return None
    segment, p50_share, p99_share = found
    return (
        f"most time: {segment['from']} > {segment['to']} ({p50_share:.0f} % of p50, {p99_share:.0f} % of p99)"
    )


def _workload_text(hop: dict[str, Any]) -> str:
    """A hop's container and pod as the report's hop table shows them ("" when it has none)."""
    container, pod = hop.get("container", ""), hop.get("pod", "")
    if pod:
        return f"pod {pod} (container {container})" if container else f"pod {pod}"
    return f"container {container}" if container else ""


def render_text(report: dict[str, Any]) -> str:
    """An aligned text table of the report (segments in path order, then end to end), under a line naming
    the segment where most time goes."""
    head = ["segment", "count", "mean", "p50", "p90", "p99", "max", "incomplete", "loss", "loss%", "jitter"]
    rows = [head]
    notes: list[str] = []
    for s in [*report["segments"], {**report["end_to_end"], "_name": "end to end"}]:
        name = s.get("_name") or f"{s['from']} > {s['to']}"
        if s.get("_name"):
            name = f"end to end ({s['from']} > {s['to']})"
        elif s.get("same_node"):
            name += " [node]"  # both hops on one node: this is the node's processing time
        if s.get("below_clock_bound"):
            name += f" ({WITHIN_CLOCK_BOUND})"
            known = s.get("clock_bound_ns", 0) > 0
            notes.append(
                f"{s['from']} > {s['to']}: p50 {bound_text(s)} ({WITHIN_CLOCK_BOUND}): "
                + (
                    "its two nodes' clocks agree only that closely, so its latency cannot be told from zero"
                    if known
                    else "the collector has not measured its nodes' clocks yet"
                )
            )
        if s.get("tracer_lost"):
            notes.append(
                f"{s['from']} > {s['to']}: {s['tracer_lost']} records lost by the tracer (not counted)"
            )
        if s.get("before_attach"):
            notes.append(
                f"{s['from']} > {s['to']}: {s['before_attach']} packets passed "
                + ("a hop" if s.get("_name") else s["to"])
                + " before it was attached, in flight while the trace was applied (not counted as loss)"
            )
        rows.append(
            [
                name,
                str(s["count"]),
                *(latency_text(s, field) for field in LATENCY_FIELDS),
                str(s["incomplete"]),
                str(s.get("loss_count", 0)),
                f"{100 * s.get('loss_rate', 0.0):.2f}",
                format_ns(s.get("jitter_ns", 0.0)),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"trace {report['trace']}: {report['packets']} packets, {report['complete']} complete"]
    summary = most_time_text(report)
    if summary:
        lines.append(summary)
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    if report.get("hops"):
        hrows = [["hop", "packets/s", "bytes/s", "container / pod"]] + [
            [h["hop"], f"{h['packets_per_s']:.1f}", f"{h['bytes_per_s']:.1f}", _workload_text(h)]
            for h in report["hops"]
        ]
        if not any(r[3] for r in hrows[1:]):  # no hop named by a workload: no such column
            hrows = [r[:3] for r in hrows]
        hw = [max(len(r[i]) for r in hrows) for i in range(len(hrows[0]))]
        lines.append("")
        for r in hrows:
            cells = [r[0].ljust(hw[0]), r[1].rjust(hw[1]), r[2].rjust(hw[2]), *r[3:]]
            lines.append("  ".join(cells).rstrip())
    segments = [*report["segments"], {**report["end_to_end"], "_name": "end to end"}]
    if any(s.get("drops") for s in segments):
        lines.append("")
        lines.append("drops (where the kernel freed the lost packets, and why):")
        for s in segments:
            if s.get("loss_count") or s.get("drops"):
                name = "end to end" if s.get("_name") else f"{s['from']} > {s['to']}"
                lines.append(f"  {name}: {loss_text(s)}")
    address_lines = addresses_lines(report)
    if address_lines:
        lines.append("")
        lines.extend(address_lines)
    action_lines = hop_actions_lines(report.get("hops", []))
    if action_lines:
        lines.append("")
        lines.extend(action_lines)
    if report.get("events"):
        lines.append("")
        lines.append("events:")
        lines.extend(f"  {line}" for line in events_lines(report["events"]))
    notes.extend(clock_jump_text(j) for j in report.get("clock_jumps", []))
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return "\n".join(lines) + "\n"


def hop_actions_lines(hops: list[dict[str, Any]]) -> list[str]:
    """Hops' counts and histograms, briefly: one line per hop and node for counts, one per histogram."""
    out: list[str] = []
    for h in hops:
        for node in dict.fromkeys(c["node"] for c in h.get("counts", [])):
            mine = [c for c in h["counts"] if c["node"] == node]
            out.append(f"{h['hop']} @{node}: {count_text(mine)}")
        for g in h.get("histograms", []):
            fmt = format_ns if g["field"] == "latency" else str
            out.append(f"{h['hop']} @{g['node']}: histogram {histogram_text(g, fmt)}")
        for r in h.get("recorded", []):
            out.append(f"{h['hop']} @{r['node']}: recorded {recorded_text(r)}")
    return out


def recorded_text(recorded: dict[str, Any]) -> str:
    """A recorded field in one line: ``len (n=20): min 60 mean 80.0 max 100 last 60``."""
    return (
        f"{recorded['field']} (n={recorded['count']}): min {recorded['min']} mean {recorded['mean']:.1f}"
        f" max {recorded['max']} last {recorded['last']}"
    )


def count_text(counts: list[dict[str, Any]], limit: int = 8) -> str:
    """A hop's counts in one line: ``count 20`` or ``count by cpu: 0=12 1=8``."""
    if not counts:
        return ""
    parts = []
    for by in dict.fromkeys(c["by"] for c in counts):
        mine = [c for c in counts if c["by"] == by]
        if not by:
            parts.append(f"count {sum(c['count'] for c in mine)}")
            continue
        keys = sorted(mine, key=lambda c: -c["count"])[:limit]
        more = f" (+{len(mine) - limit} keys)" if len(mine) > limit else ""
        parts.append(
            f"count by {by}: "
            + " ".join(f"{c.get('key_name') or c['key']}={c['count']}" for c in keys)
            + more
        )
    return "; ".join(parts)


def histogram_text(histogram: dict[str, Any], format_value: Any = str) -> str:
    """A histogram in one line: ``latency (n=20): <=1.0us 3, <=2.0us 17``."""
    buckets = ", ".join(f"<={format_value(b['le'])} {b['count']}" for b in histogram["buckets"])
    return f"{histogram['field']} (n={histogram['total']}): {buckets}"


def events_lines(events: list[dict[str, Any]], limit: int = 16) -> list[str]:
    """The report's text section: one line per event and node, one more for its histogram."""
    lines = []
    for e in events:
        line = f"{e['name']} on {e['node']}: count {e['count']}"
        if e["count_by"]:
            keys = list(e["by"].items())
            more = f" (+{len(keys) - limit} keys)" if len(keys) > limit else ""
            line += f"; by {e['count_by']}: " + " ".join(f"{k}={n}" for k, n in keys[:limit]) + more
        lines.append(line)
        if e["histogram"]:
            total = sum(b["count"] for b in e["histogram"])
            buckets = ", ".join(f"<={b['le']} {b['count']}" for b in e["histogram"])
            unit = " ns" if e["histogram_arg"] == "latency" else ""
            missed = f", {e['latency_missed']} without a start" if e.get("latency_missed") else ""
            lines.append(f"  {e['histogram_arg']}{unit} (n={total}{missed}): {buckets}")
        for r in e.get("recorded", []):
            lines.append(
                f"  {r['arg']}: n={r['count']} sum={r['sum']:g} mean={r['mean'] or 0:.6g} min={r['min']}"
                f" max={r['max']} last={r['last']}"
            )
    return lines
