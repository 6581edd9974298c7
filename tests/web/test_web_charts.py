"""The results page's time series, as Chromium draws it, says what the table says: a cross-host segment's p50
within its clock bound is drawn at zero inside a band labelled with the bound (the table reads "≤ ±170ns"),
never below zero as a negative latency; the lines break where no window was written instead of joining
across the gap; the time axis is 24-hour UTC, as every time on the page. It drew the p50 at -0.1 µs, joined
the two runs of windows, and labelled the axis in the browser's 12-hour local time.

Real InfluxDB holding the collector's windows, a real dispatcher reading them (`glance`), Chart.js in headless
Chromium; the numbers are read from the chart object Chart.js drew."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from stored_results import BOUND_NS, SERIES_WIRE_P50_NS, Glance, write_series
from web_helpers import PASSWORD, USERNAME, live_server, screenshot, web_config

from hoptrace.web import create_app

CHART = "return Chart.getChart('timeseries-chart')"


def test_the_time_series_keeps_within_the_clock_bound_breaks_at_gaps_and_reads_utc(
    glance: Glance, influxd: Any, browser: Any
) -> None:
    trace = f"series-{secrets.token_hex(3)}"
    starts = write_series(influxd, trace, glance.measured)
    app = create_app(web_config(DISPATCHER=glance.dispatcher.address))
    with live_server(app) as base:
        browser.get(base + "/login")
        browser.find_element(By.ID, "username").send_keys(USERNAME)
        browser.find_element(By.ID, "password").send_keys(PASSWORD)
        browser.find_element(By.ID, "login").click()
        WebDriverWait(browser, 20).until(lambda d: "/login" not in d.current_url)
        browser.get(f"{base}/traces/{trace}/results?since=5m")
        WebDriverWait(browser, 30).until(
            lambda d: d.find_element(By.ID, "results").get_attribute("data-updated"), "the first poll"
        )
        WebDriverWait(browser, 30).until(lambda d: d.execute_script(CHART + " !== undefined"), "the chart")
        sets = browser.execute_script(
            CHART
            + ".data.datasets.map(s => ({label: s.label, bound: s.clockBound || 0, fill: s.fill || false,"
            " points: s.data.map(p => [p.x, p.y])}))"
        )
        by_label = {s["label"]: s for s in sets}
        wire = by_label["a-wire-out → b-wire-in p50"]
        host = by_label["a-c1-out → a-wire-out p50"]

        # within the clock bound: at zero, inside a band up to the bound, labelled with it
        drawn = [y for _, y in wire["points"] if y is not None]
        assert drawn and all(y == 0 for y in drawn), wire  # the window's p50 is -100 ns: never drawn below 0
        assert all(y is None or y >= 0 for s in sets for _, y in s["points"]), sets
        (band,) = [s for s in sets if s["bound"]]
        assert (
            band["label"] == f"a-wire-out → b-wire-in: clock bound ±{BOUND_NS}ns" and band["fill"] == "origin"
        )
        assert {y for _, y in band["points"]} == {BOUND_NS / 1e3}, band
        assert browser.execute_script(CHART + ".scales.y.min") == 0
        assert SERIES_WIRE_P50_NS < 0

        # the gap between the two runs of windows is a break in every line, not a segment across it
        first_run_end, second_run_start = starts[4] // 1_000_000, starts[5] // 1_000_000
        for line in (wire, host):
            xs = [x for x, y in line["points"]]
            breaks = [x for x, y in line["points"] if y is None]
            assert len(breaks) == 1 and first_run_end < breaks[0] < second_run_start, line
            assert xs == sorted(xs) and xs[0] < breaks[0] < xs[-1], line  # windows on both sides
        assert {y for _, y in host["points"] if y is not None} == {3.0}, host

        # 24-hour UTC on the axis
        ticks = browser.execute_script(CHART + ".scales.x.ticks.map(t => [t.value, t.label])")
        assert ticks, "no ticks"
        for value, label in ticks:
            assert label == datetime.fromtimestamp(value / 1000, tz=UTC).strftime("%H:%M:%S"), ticks
        assert browser.execute_script(CHART + ".options.scales.x.title.text") == "time (UTC)"
        browser.execute_script("document.getElementById('timeseries-chart').scrollIntoView()")
        screenshot(browser, "results-series-clock-bound")
