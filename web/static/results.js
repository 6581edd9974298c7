// Results page: charts (Chart.js) and tables refreshed from the JSON endpoint every 2 s.
(() => {
  // The range applies as soon as it is picked. A listener, not an inline onchange: the app's
  // Content-Security-Policy (script-src 'self') blocks inline handlers. Without script, "Show" submits.
  const range = document.getElementById("range");
  if (range) {
    range.addEventListener("change", () => range.form.submit());
    const show = document.getElementById("range-show");
    if (show) show.hidden = true;
  }
  const root = document.getElementById("results");
  if (!root) return;
  const url = root.dataset.url;
  const pollMs = Number(root.dataset.pollMs) || 2000;
  const palette = ["#2557d6", "#e8710a", "#11733b", "#b3261e", "#7e3fb8", "#00838f", "#c2185b", "#6d4c41",
    "#5f6b00", "#455a64"];
  const color = (i) => palette[i % palette.length];
  const hasCharts = typeof window.Chart !== "undefined";

  function fmtNs(ns) {
    const a = Math.abs(ns);
    if (a < 1e3) return `${ns.toFixed(0)}ns`;
    if (a < 1e6) return `${(ns / 1e3).toFixed(1)}us`;
    if (a < 1e9) return `${(ns / 1e6).toFixed(2)}ms`;
    return `${(ns / 1e9).toFixed(2)}s`;
  }
  const segName = (s) => `${s.from} → ${s.to}`;

  function cell(text, numeric) {
    const td = document.createElement("td");
    td.textContent = text;
    if (numeric) td.className = "num";
    return td;
  }

  function segmentRow(s, label) {
    const tr = document.createElement("tr");
    const name = cell(label);
    if (s.same_node) name.insertAdjacentHTML("beforeend", ' <small class="tag">same node</small>');
    if (s.display.clock_note) {
      const note = document.createElement("small");
      note.className = "tag warn clock-note";
      note.textContent = s.display.clock_note;  // "≤ ±170ns (within clock bound)", made by the server
      name.append(" ", note);
    }
    tr.append(name);
    const count = cell(String(s.count), true);
    count.classList.add("count");
    // Latencies as the server wrote them (hoptrace.results.report_view.latency_text): never negative.
    const p50 = cell(s.display.p50_ns, true);
    p50.classList.add("p50");
    const p99 = cell(s.display.p99_ns, true);
    p99.classList.add("p99");
    tr.append(
      count,
      cell(s.display.mean_ns, true), p50, cell(s.display.p90_ns, true),
      p99, cell(s.display.max_ns, true), cell(String(s.incomplete), true),
      cell(String(s.loss_count), true), cell(`${(100 * s.loss_rate).toFixed(2)}%`, true),
      cell(String(s.tracer_lost), true), cell(fmtNs(s.jitter_ns), true), cell(fmtNs(s.jitter_p99_ns), true),
    );
    return tr;
  }

  function renderTables(data) {
    const r = data.report;
    document.querySelector("#decomposition tbody").replaceChildren(...r.segments.map((s) => segmentRow(s, segName(s))));
    const e2e = r.end_to_end;
    document.querySelector("#decomposition tfoot").replaceChildren(segmentRow(e2e, `end to end (${segName(e2e)})`));
    const noData = document.getElementById("no-data");
    if (noData) noData.hidden = r.segments.length > 0;
    document.querySelector("#throughput tbody").replaceChildren(
      ...r.hops.map((h) => {
        const tr = document.createElement("tr");
        const workload = (h.container || "") + (h.pod ? ` (pod ${h.pod})` : "");
        tr.append(
          cell(h.hop),
          cell(h.packets_per_s.toFixed(1), true),
          cell(h.bytes_per_s.toFixed(1), true),
          cell(workload),
        );
        return tr;
      }),
    );
    // The path graph, drawn by the server from the same report (hoptrace.web.pathgraph).
    const graph = document.getElementById("path-graph");
    if (graph && data.graph_html !== undefined) graph.innerHTML = data.graph_html;
    // Hop counts/histograms and events, drawn by the server from the same report (hoptrace.web.actions).
    const actions = document.getElementById("actions");
    if (actions && data.actions_html !== undefined) actions.innerHTML = data.actions_html;
    const drops = document.getElementById("drops");  // drops: true (hoptrace.web.results.drops_html)
    if (drops && data.drops_html !== undefined) drops.innerHTML = data.drops_html;
    const addresses = document.getElementById("addresses");  // hoptrace.web.results.addresses_html
    if (addresses && data.addresses_html !== undefined) addresses.innerHTML = data.addresses_html;
    const summary = document.getElementById("most-time");
    summary.textContent = data.summary || "";
    summary.hidden = !data.summary;
    document.getElementById("status").textContent =
      `${data.state} · ${r.packets} packets, ${r.complete} complete · ${data.generated_at}`;
  }

  const charts = {};
  const usTicks = { callback: (v) => `${v} µs` };

  function upsert(id, config) {
    if (charts[id]) {
      charts[id].data = config.data;
      charts[id].update("none");
    } else {
      charts[id] = new window.Chart(document.getElementById(id), config);
    }
  }

  function renderCharts(data) {
    const segs = data.report.segments;
    // One horizontal bar per percentile, one stack part per segment: where the time goes along the path.
    upsert("decomposition-chart", {
      type: "bar",
      data: {
        labels: ["p50", "p90", "p99"],
        datasets: segs.map((s, i) => ({
          label: segName(s),
          data: [s.p50_ns, s.p90_ns, s.p99_ns].map((ns) => Math.max(ns, 0) / 1e3),
          backgroundColor: color(i),
        })),
      },
      options: {
        indexAxis: "y", animation: false, responsive: true, maintainAspectRatio: false,
        scales: { x: { stacked: true, ticks: usTicks, title: { display: true, text: "µs (sum of segment percentiles)" } }, y: { stacked: true } },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      },
    });
    // Each segment's p50/p99 over time. Lines break where windows are missing (the server puts a null
    // there). A cross-node segment's clock bound is drawn as a band from 0 to the bound: a latency inside
    // it cannot be told from zero (the table says "≤ ±BOUND"), so it is drawn at 0 and read as within the
    // bound, never as a negative latency.
    const datasets = [];
    let first = Infinity;
    let last = -Infinity;
    Object.keys(data.series).forEach((segment, i) => {
      const series = data.series[segment];
      const bound = series.clock_bound_ns || 0;
      const name = segment.replace(">", " → ");
      for (const [q, dash] of [["p50", []], ["p99", [5, 4]]]) {
        const label = `${name} ${q}`;
        datasets.push({
          label,
          bound,  // read by the tooltip: this poll's, not the first's
          data: series[q].map(([t, ns]) => {
            first = Math.min(first, t);
            last = Math.max(last, t);
            return { x: t, y: ns === null ? null : Math.max(ns, 0) / 1e3, ns };
          }),
          borderColor: color(i), backgroundColor: color(i), borderDash: dash, pointRadius: 2, borderWidth: 1.5,
          spanGaps: false,
        });
      }
      if (bound > 0) {
        datasets.push({
          label: `${name}: clock bound ±${fmtNs(bound)}`,
          clockBound: bound,
          data: [],  // spans the chart once the range is known (below)
          borderColor: "rgba(179, 38, 30, 0.5)", backgroundColor: "rgba(179, 38, 30, 0.12)",
          borderWidth: 1, borderDash: [2, 2], pointRadius: 0, fill: "origin",
        });
      }
    });
    for (const set of datasets) {
      if (set.clockBound && first <= last) {
        set.data = [{ x: first, y: set.clockBound / 1e3 }, { x: last, y: set.clockBound / 1e3 }];
      }
    }
    const utc = (ms) => new Date(ms).toISOString().slice(11, 19);  // 24-hour UTC, as every time on the page
    upsert("timeseries-chart", {
      type: "line",
      data: { datasets },
      options: {
        animation: false, parsing: false, responsive: true, maintainAspectRatio: false,
        scales: {
          x: {
            type: "linear", ticks: { maxTicksLimit: 8, callback: (v) => utc(v) },
            title: { display: true, text: "time (UTC)" },
          },
          y: { ticks: usTicks, min: 0, beginAtZero: true },
        },
        plugins: {
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          tooltip: {
            callbacks: {
              title: (items) => (items.length ? `${new Date(items[0].parsed.x).toISOString().slice(0, 19)}Z` : ""),
              label: (item) => {
                const set = item.dataset;
                if (set.clockBound) return set.label;
                const bound = set.bound || 0;
                const ns = item.raw.ns;
                if (bound > 0 && ns <= bound) return `${set.label}: ≤ ±${fmtNs(bound)} (within clock bound)`;
                return `${set.label}: ${fmtNs(ns)}`;
              },
            },
          },
        },
      },
    });
    upsert("loss-chart", {
      type: "bar",
      data: {
        labels: segs.map(segName),
        datasets: [
          { label: "loss %", data: segs.map((s) => 100 * s.loss_rate), backgroundColor: "#b3261e", yAxisID: "loss" },
          { label: "jitter (µs)", data: segs.map((s) => s.jitter_ns / 1e3), backgroundColor: "#2557d6", yAxisID: "jitter" },
        ],
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        scales: {
          loss: { position: "left", beginAtZero: true, title: { display: true, text: "loss %" } },
          jitter: { position: "right", beginAtZero: true, title: { display: true, text: "jitter µs" }, grid: { drawOnChartArea: false } },
          x: { ticks: { autoSkip: false, maxRotation: 60, minRotation: 30, font: { size: 10 } } },
        },
      },
    });
    const hops = data.report.hops;
    upsert("throughput-chart", {
      type: "bar",
      data: {
        labels: hops.map((h) => h.hop),
        datasets: [
          { label: "packets/s", data: hops.map((h) => h.packets_per_s), backgroundColor: "#11733b", yAxisID: "pps" },
          { label: "kB/s", data: hops.map((h) => h.bytes_per_s / 1e3), backgroundColor: "#e8710a", yAxisID: "bps" },
        ],
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        scales: {
          pps: { position: "left", beginAtZero: true, title: { display: true, text: "packets/s" } },
          bps: { position: "right", beginAtZero: true, title: { display: true, text: "kB/s" }, grid: { drawOnChartArea: false } },
          x: { ticks: { autoSkip: false, maxRotation: 60, minRotation: 30, font: { size: 10 } } },
        },
      },
    });
  }

  const errorBox = document.getElementById("results-error");
  async function poll() {
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      const data = await response.json();
      if (!response.ok || data.error) throw new Error(data.error || response.statusText);
      errorBox.hidden = true;
      renderTables(data);
      if (hasCharts) renderCharts(data);
      root.dataset.updated = data.generated_at;
    } catch (error) {
      errorBox.textContent = String(error.message || error);
      errorBox.hidden = false;
    } finally {
      setTimeout(poll, pollMs);
    }
  }
  poll();
})();
