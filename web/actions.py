"""The results page's hop actions and event probes: per hop its in-kernel counts (total, and by key),
histograms and recorded values (record action: per field and node, packets, min, mean, max, last), per event
and node its count, by-key table, histogram (an argument's or an event-to-event latency) and recorded
arguments.

Every number is the report's (`GetReport`, the same as `hoptrace report --json`): this module only arranges
it for templates/_actions.html, one small function per section, so another kind of per-hop result (e.g. a
table of recorded values) is one more function and one more macro beside these. The fragment is rendered
on the server (readable without scripts) and sent again as `actions_html` in the polled JSON.
"""

from __future__ import annotations

from typing import Any

from flask import render_template

from hoptrace.results.format import format_ns

# Fields whose values are durations in ns: their bucket bounds read as time (1.0us - 2.0us).
DURATION_FIELDS = frozenset({"latency"})
# The unit of each catalogue field that has one (hoptrace.h enum hoptrace_field), shown beside its values.
FIELD_UNITS = {"len": "bytes", "gso_size": "bytes", "latency": "ns"}


def bucket_low(le: int) -> int:
    """Inclusive lower bound of the log2 bucket whose inclusive upper bound is `le` (hop.bpf.h: bucket b
    holds [2^(b-1), 2^b - 1], bucket 0 only 0)."""
    return (le + 1) // 2


def bucket_label(le: int, field: str) -> str:
    """A bucket's bounds as a reader takes them: ``1024–2047`` for sizes, ``1.0us–2.0us`` for durations."""
    low = bucket_low(le)
    if field in DURATION_FIELDS or field.endswith("_ns"):
        return format_ns(low) if low == le else f"{format_ns(low)}–{format_ns(le)}"
    return str(low) if low == le else f"{low}–{le}"


def histogram_view(field: str, buckets: list[dict[str, int]]) -> dict[str, Any]:
    """One histogram as bars: each non-empty bucket with its label and width (% of the largest bucket)."""
    largest = max((b["count"] for b in buckets), default=0)
    return {
        "field": field,
        "total": sum(b["count"] for b in buckets),
        "buckets": [
            {
                "le": b["le"],
                "label": bucket_label(b["le"], field),
                "count": b["count"],
                "width": round(100 * b["count"] / largest, 1) if largest else 0,
            }
            for b in sorted(buckets, key=lambda b: b["le"])
            if b["count"]
        ],
    }


def by_key_view(by: str, counts: dict[str, int]) -> dict[str, Any]:
    """A count by key as a table: keys in numeric order when they are numbers, each with its share."""
    total = sum(counts.values())
    keys = sorted(counts, key=lambda k: (0, int(k), "") if k.lstrip("-").isdigit() else (1, 0, k))
    return {
        "by": by,
        "total": total,
        "rows": [
            {"key": k, "count": counts[k], "share": round(100 * counts[k] / total, 1) if total else 0.0}
            for k in keys
        ],
    }


def hop_counts_view(counts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A hop's counts per node: the total and, for a count by a field, its by-key table."""
    nodes: dict[str, dict[str, Any]] = {}
    for c in counts:
        node = nodes.setdefault(c["node"], {"node": c["node"], "total": 0, "by": {}})
        node["total"] += c["count"]
        if c["by"]:
            node["by"].setdefault(c["by"], {})[c.get("key_name") or str(c["key"])] = c["count"]
    return [
        {
            "node": n["node"],
            "total": n["total"],
            "tables": [by_key_view(by, keys) for by, keys in sorted(n["by"].items())],
        }
        for n in sorted(nodes.values(), key=lambda n: n["node"])
    ]


def hop_histograms_view(histograms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A hop's histograms, each with its node."""
    return [{"node": g["node"], **histogram_view(g["field"], g["buckets"])} for g in histograms]


def hop_recorded_view(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A hop's recorded fields as table rows, by field then node, each with its unit ("" if none)."""
    return [
        {**r, "mean": round(r["mean"], 1), "unit": FIELD_UNITS.get(r["field"], "")}
        for r in sorted(recorded, key=lambda r: (r["field"], r["node"]))
    ]


def hop_sections(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every hop that has counts, histograms or recorded values in the report, in the report's hop order."""
    return [
        {
            "hop": h["hop"],
            "counts": hop_counts_view(h.get("counts", [])),
            "histograms": hop_histograms_view(h.get("histograms", [])),
            "recorded": hop_recorded_view(h.get("recorded", [])),
        }
        for h in report.get("hops", [])
        if h.get("counts") or h.get("histograms") or h.get("recorded")
    ]


def event_recorded_view(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An event's recorded arguments as table rows (record action: its statistics in the kernel)."""
    return [
        {**r, "mean": round(r["mean"], 1) if r.get("mean") is not None else ""}
        for r in sorted(recorded, key=lambda r: r["arg"])
    ]


def event_sections(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event probe's result per node: its count, by-key table, histogram (an argument's, or the
    latency since its `since:` event, with the hits that found no start) and recorded arguments."""
    return [
        {
            "name": e["name"],
            "node": e["node"],
            "count": e["count"],
            "table": by_key_view(e["count_by"], e["by"]) if e.get("count_by") and e.get("by") else None,
            "histogram": histogram_view(e["histogram_arg"], e["histogram"]) if e.get("histogram") else None,
            "latency_missed": e.get("latency_missed", 0),
            "recorded": event_recorded_view(e.get("recorded", [])),
        }
        for e in report.get("events", [])
    ]


def render(report: dict[str, Any]) -> str:
    """The hop-actions and events fragment of the results page (templates/_actions.html)."""
    return render_template("_actions.html", hops=hop_sections(report), events=event_sections(report))
