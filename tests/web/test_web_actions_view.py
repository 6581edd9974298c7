"""The results page's hop-actions and events fragment (hoptrace.web.actions) from a report dict shaped as
`report_from_proto` returns it: bucket bounds a reader can take in, every number of the report shown once,
keys in numeric order, recorded values with their units, and a note instead of empty tables when there is
nothing."""

from __future__ import annotations

import re

from flask import Flask

from hoptrace.web import actions

REPORT = {
    "hops": [
        {"hop": "plain", "counts": [], "histograms": []},
        {
            "hop": "wire-in",
            "counts": [
                {"node": "host-b", "by": "cpu", "key": 10, "count": 3},
                {"node": "host-b", "by": "cpu", "key": 2, "count": 17},
            ],
            "histograms": [
                {
                    "node": "host-b",
                    "field": "len",
                    "total": 20,
                    "buckets": [{"le": 255, "count": 15}, {"le": 127, "count": 5}],
                }
            ],
            "recorded": [
                {
                    "node": "host-b",
                    "field": "ttl",
                    "count": 20,
                    "min": 63,
                    "max": 64,
                    "mean": 63.75,
                    "last": 64,
                },
                {
                    "node": "host-b",
                    "field": "len",
                    "count": 20,
                    "min": 98,
                    "max": 156,
                    "mean": 141.5,
                    "last": 156,
                },
            ],
        },
        {
            "hop": "veth-in",
            "counts": [{"node": "host-a", "by": "", "key": 0, "count": 20}],
            "histograms": [
                {
                    "node": "host-a",
                    "field": "latency",
                    "total": 20,
                    "buckets": [
                        {"le": 0, "count": 1},
                        {"le": 2047, "count": 12},
                        {"le": 4194303, "count": 7},
                    ],
                }
            ],
        },
    ],
    "events": [
        {
            "name": "net-rx",
            "node": "host-a",
            "count": 9,
            "count_by": "cpu",
            "by": {"1": 4, "0": 5},
            "histogram_arg": "len",
            "histogram": [{"le": 2047, "count": 9}],
        },
        {
            "name": "plain",
            "node": "host-b",
            "count": 4,
            "count_by": "",
            "by": {},
            "histogram_arg": "",
            "histogram": [],
        },
        {
            "name": "wakeup-to-run",
            "node": "host-b",
            "count": 52,
            "count_by": "",
            "by": {},
            "histogram_arg": "latency",
            "histogram": [{"le": 4095, "count": 40}, {"le": 65535, "count": 10}],
            "latency_missed": 2,
            "recorded": [
                {"arg": "prio", "count": 52, "sum": 6240.0, "mean": 120.0, "min": 120, "max": 120,
                 "last": 120, "signed": True},
            ],
        },
    ],
}  # fmt: skip


def test_bucket_bounds_read_as_sizes_or_durations():
    assert actions.bucket_label(0, "len") == "0"
    assert actions.bucket_label(1, "len") == "1"
    assert actions.bucket_label(2047, "len") == "1024–2047"
    assert actions.bucket_label(1023, "latency") == "512ns–1.0us"
    assert actions.bucket_label(2047, "latency") == "1.0us–2.0us"
    assert actions.bucket_label(4194303, "latency") == "2.10ms–4.19ms"


def test_sections_hold_the_reports_numbers_in_order():
    hops = actions.hop_sections(REPORT)
    assert [h["hop"] for h in hops] == ["wire-in", "veth-in"]  # a hop without actions has no section
    (wire,) = hops[0]["counts"]
    assert wire["total"] == 20
    (by_cpu,) = wire["tables"]
    assert [(r["key"], r["count"], r["share"]) for r in by_cpu["rows"]] == [("2", 17, 85.0), ("10", 3, 15.0)]
    (sizes,) = hops[0]["histograms"]
    assert [(b["le"], b["label"], b["count"], b["width"]) for b in sizes["buckets"]] == [
        (127, "64–127", 5, 33.3),
        (255, "128–255", 15, 100.0),
    ]
    assert hops[1]["counts"] == [{"node": "host-a", "total": 20, "tables": []}]
    events = actions.event_sections(REPORT)
    assert events[0]["count"] == 9 and [r["key"] for r in events[0]["table"]["rows"]] == ["0", "1"]
    assert events[0]["histogram"]["total"] == 9
    assert events[1]["table"] is None and events[1]["histogram"] is None
    assert events[1]["recorded"] == [] and events[1]["latency_missed"] == 0


def test_an_event_latency_reads_as_time_with_its_misses_and_recorded_arguments():
    (run,) = [e for e in actions.event_sections(REPORT) if e["name"] == "wakeup-to-run"]
    assert [b["label"] for b in run["histogram"]["buckets"]] == ["2.0us–4.1us", "32.8us–65.5us"]
    assert run["histogram"]["total"] == 50 and run["latency_missed"] == 2
    app = Flask("hoptrace.web")
    with app.app_context():
        html = actions.render(REPORT)
    section = html[html.index('data-event="wakeup-to-run"') :]
    assert "2 hits found no start for their key" in section
    row = '<tr data-arg="prio"><td>prio</td><td class="num hits">52</td><td class="num min">120</td>'
    assert row in section


def test_fragment_shows_every_number_and_says_when_there_is_nothing():
    app = Flask("hoptrace.web")
    with app.app_context():
        html = actions.render(REPORT)
        empty = actions.render({"hops": [{"hop": "plain", "counts": [], "histograms": []}], "events": []})
    assert re.findall(r'data-hop="([^"]+)"', html) == ["wire-in", "veth-in"]
    assert '<strong class="count-total">20</strong>' in html
    assert '<tr data-key="2"><td>2</td><td class="num count">17</td>' in html
    assert re.search(
        r'data-le="2047"><td class="num bound">1.0us–2.0us</td><td class="num count">12</td>', html
    )
    assert re.search(
        r'data-event="net-rx" data-node="host-a">.*?<strong class="count-total">9</strong>', html, re.S
    )
    assert 'id="no-hop-actions"' in empty and 'id="no-events"' in empty
    assert "count-total" not in empty


def test_recorded_values_are_rows_by_field_with_units():
    (wire,) = [h for h in actions.hop_sections(REPORT) if h["hop"] == "wire-in"]
    assert [
        (r["field"], r["node"], r["count"], r["min"], r["mean"], r["max"], r["last"], r["unit"])
        for r in wire["recorded"]
    ] == [
        ("len", "host-b", 20, 98, 141.5, 156, 156, "bytes"),
        ("ttl", "host-b", 20, 63, 63.8, 64, 64, ""),
    ]
    # A hop with only a record action has a section of its own.
    only = {
        "hops": [
            {
                "hop": "recorded-only",
                "counts": [],
                "histograms": [],
                "recorded": REPORT["hops"][1]["recorded"],
            }
        ]
    }
    assert [h["hop"] for h in actions.hop_sections(only)] == ["recorded-only"]
    app = Flask("hoptrace.web")
    with app.app_context():
        html = actions.render({**only, "events": []})
    assert "no-hop-actions" not in html
    assert re.search(
        r'<tr data-field="len" data-node="host-b"><td>len</td><td>host-b</td><td class="num packets">20</td>'
        r'<td class="num min">98</td><td class="num mean">141.5</td><td class="num max">156</td>'
        r'<td class="num last">156</td><td class="unit">bytes</td></tr>',
        html,
    ), html
    assert '<td class="unit"></td>' in html  # ttl has no unit
