"""hoptrace's benchmarks: `make bench` (--full) and `make bench-quick` (--quick, part of `make test`).

    .venv/bin/python bench/run.py --full|--quick [--only NAME[,NAME...]]

Runs every benchmark module in turn (bpf_cost, event_cost, action_cost, agent_records, collector, dispatcher,
overhead, accuracy, scale, many_traces; docs/benchmarks.md), with --quick also every other script of bench/
once at a tiny size, three side by side (SMOKE_RUNS; they run on their own at full size), writes
`bench/results/<UTC time>.json`, a Markdown summary beside it and PNG plots. A benchmark that fails makes
the run exit non-zero after the others ran (and cleaned up).
Targets are reported, met or missed, never asserted. Needs root (namespaces, BPF).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import BenchContext, log  # bench/ is the script's own directory, first on sys.path

BENCH = Path(__file__).resolve().parent

BENCHMARKS = [
    "bpf_cost",
    "event_cost",
    "action_cost",
    "agent_records",
    "collector",
    "dispatcher",
    "overhead",
    "accuracy",
    "scale",
    "many_traces",
]
RESULTS = BENCH / "results"

# Benchmarks and case studies with flags and sizes of their own, run on their own (docs/benchmarks.md,
# docs/case-studies/, docs/mace.md, docs/iron.md): --quick runs each once at a tiny size, so that none
# breaks unnoticed: its whole code path (a cluster up, a trace applied, traffic, a report that accounts for
# it), once. Their numbers come from their own runs, never from these. The longest first (smoke_runs).
SMOKE_RUNS: dict[str, list[str]] = {
    # One case each, the one that runs the most of the script (the 8-hop overlay, the CPU hog, the load).
    "case_container_overlay": ["--seconds=1", "--mps=100", "--iperf-seconds=0", "--path=overlay", "--json"],
    "object_ab": ["--rounds", "1", "--seconds", "1"],
    # The two conditions that run an object built here: a patched hop object, and the floor in the
    # agent's ring instead of its hops.
    "ring_cost": ["--rounds", "1", "--conditions", "local,floor", "--seconds", "1"],
    "case_scheduling_delay": ["--seconds", "1", "--mps", "100", "--case", "cpu-shared", "--json"],
    "case_congested_bridge": ["--seconds", "1", "--mps", "100", "--case", "1-flow-1-port", "--json"],
    "kafka_collectors": ["--packets", "2000", "--cases", "1:1"],
    "idle_cost": ["--seconds", "0.5", "--settle", "0"],
    "tcp_overhead": ["--rounds", "1", "--seconds", "1", "--conditions", "none,hops"],
    # the least UDP tagger (an object built here, in the agent's ring) beside hoptrace's, bracketed
    "udp_tag_floor": ["--rounds", "1", "--seconds", "1"],
    "iron_penalty": ["--work", "200000", "--json"],
    "tail_cause": ["--rounds", "1", "--seconds", "1", "--conditions", "none"],
    "mace_rtt": ["--rounds", "1", "--count", "20", "--json"],
    "collector_pipeline": ["--baseline", "HEAD", "--packets", "2000", "--rounds", "1"],
    "collector_join": ["--packets", "2000", "--hops", "2"],
    "otlp_cost": ["--packets", "2000", "--rounds", "1"],
    "import_cost": ["--packets", "2000", "--rounds", "1"],
    # These two boot qemu guests (minutes under TCG): their smoke run is the script's import and flags;
    # tests/vms runs the same guests lab (lab/guest_cluster.py) in make test.
    "case_vm_ovs": ["--help"],
    "case_vm_scheduling": ["--help"],
}
# A smoke run past this is broken, not slow.
SMOKE_TIMEOUT_S = 300
# Smoke runs side by side: they mostly wait (for clusters, reports, traffic), and their numbers are not used.
# Those that switch kernel.bpf_stats_enabled take turns at it (common.bpf_stats_enabled holds a lock).
SMOKE_AT_ONCE = 3

_smoke_processes: set[subprocess.Popen[str]] = set()
_smoke_lock = threading.Lock()
_smoke_stopped = threading.Event()  # interrupted: a smoke run starting now is killed at once


def smoke_run(name: str) -> dict[str, Any]:
    """`bench/NAME.py` with its SMOKE_RUNS flags, in a process of its own: exit status, time, output."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, str(BENCH / f"{name}.py"), *SMOKE_RUNS[name]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with _smoke_lock:
        _smoke_processes.add(process)
        if _smoke_stopped.is_set():
            process.kill()
    try:
        stdout, stderr = process.communicate(timeout=SMOKE_TIMEOUT_S)
        code, output = process.returncode, stdout + stderr
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        code, output = -9, f"{stdout}{stderr}\nkilled after {SMOKE_TIMEOUT_S} s"
    finally:
        with _smoke_lock:
            _smoke_processes.discard(process)
    return {
        "args": SMOKE_RUNS[name],
        "returncode": code,
        "seconds": time.monotonic() - started,
        "output_tail": output[-3000:],
    }


def smoke_runs(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each of `names` by `smoke_run`, SMOKE_AT_ONCE side by side, started in their order; the results in
    that order. Interrupted, the running ones are killed and the rest not started."""

    def logged(name: str) -> dict[str, Any]:
        log(f"== {name} (smoke run: {' '.join(SMOKE_RUNS[name])})")
        result = smoke_run(name)
        if result["returncode"] != 0:
            log(f"{name} FAILED (exit {result['returncode']}):\n{result['output_tail']}")
        return result

    pool = ThreadPoolExecutor(max_workers=SMOKE_AT_ONCE, thread_name_prefix="smoke")
    try:
        runs = {name: pool.submit(logged, name) for name in names}
        return {name: run.result() for name, run in runs.items()}
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        with _smoke_lock:
            _smoke_stopped.set()
            for process in _smoke_processes:
                process.kill()
        raise
    finally:
        pool.shutdown(wait=True)


def ensure_matplotlib() -> Any:
    """matplotlib (Agg), installed into this venv with pip when missing (it is not a project dependency)."""
    try:
        import matplotlib
    except ImportError:
        log("matplotlib is missing: pip install matplotlib (into this venv, for the plots only)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def machine() -> dict[str, Any]:
    """CPU model, cores, memory, kernel."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "?"
    )
    mem_kb = int(
        next(
            line.split()[1]
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    )
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": os.uname().release,
        "uname": " ".join(os.uname()),
    }


def fmt(value: Any) -> str:
    """A table cell."""
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return "" if value is None else str(value)


def md_table(table: dict[str, Any]) -> str:
    """A results table as Markdown."""
    lines = ["| " + " | ".join(table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in table["rows"]]
    if table.get("note"):
        lines.append(f"\n{table['note']}")
    return "\n".join(lines)


def md_targets(targets: list[dict[str, Any]]) -> str:
    """Targets as Markdown: value, limit, met/missed and by how much."""
    if not targets:
        return ""
    lines = ["| target | measured | limit | met | margin |", "|---|---|---|---|---|"]
    for t in targets:
        met = "n/a" if t["met"] is None else ("met" if t["met"] else "**missed**")
        margin = "" if t["margin"] is None else f"{t['margin']:+.0%}"
        lines.append(
            f"| {t['name']} | {fmt(t['value'])} {t['unit']} | {fmt(t['limit'])} {t['unit']} | {met} | {margin} |"  # noqa: E501
        )
    return "\n".join(lines)


def summary_markdown(doc: dict[str, Any]) -> str:
    """The whole run as Markdown."""
    m = doc["machine"]
    out = [
        f"# hoptrace benchmarks, {doc['mode']} run, {doc['started']}",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}",
        "",
    ]
    if doc.get("smoke"):
        out += ["## smoke runs (SMOKE_RUNS: each script once, tiny; no numbers)", ""]
        out += ["| script | flags | exit | seconds |", "|---|---|---|---|"]
        for name, run in doc["smoke"].items():
            out.append(f"| {name} | `{' '.join(run['args'])}` | {run['returncode']} | {run['seconds']:.0f} |")
        out.append("")
    for name, result in doc["benchmarks"].items():
        out.append(f"## {name} ({result.get('seconds', 0):.0f} s)")
        if "error" in result:
            out += ["", "**FAILED**:", "", "```", result["error"], "```", ""]
            continue
        out += ["", md_table(result["table"]), ""]
        for sub, table in result.get("tables", {}).items():
            out += [f"### {sub}", "", md_table(table), ""]
        if result.get("targets"):
            out += [md_targets(result["targets"]), ""]
    return "\n".join(out)


def plots(doc: dict[str, Any], stem: Path) -> list[str]:
    """PNG plots of the results that have a shape worth plotting; their file names."""
    plt = ensure_matplotlib()
    made = []
    b = doc["benchmarks"]

    def save(fig: Any, name: str) -> None:
        path = stem.with_name(f"{stem.name}-{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path.name)

    if "conditions" in b.get("bpf_cost", {}):
        fig, ax = plt.subplots(figsize=(8, 4))
        conds = b["bpf_cost"]["conditions"]
        hops = list(conds["matching"]["hops"])
        for i, (cond, data) in enumerate(conds.items()):
            ax.bar(
                [x + i * 0.4 for x in range(len(hops))],
                [data["hops"][h]["ns_per_run"] or 0 for h in hops],
                0.4,
                label=cond,
            )
        ax.set_xticks([x + 0.2 for x in range(len(hops))], hops, rotation=30, ha="right")
        ax.axhline(150, color="r", ls="--", lw=0.8)
        ax.axhline(30, color="g", ls="--", lw=0.8)
        ax.set_ylabel("ns per run")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title("BPF run time per hop (bpf_stats)")
        save(fig, "bpf-cost")
    if "steps" in b.get("agent_records", {}):
        steps = b["agent_records"]["steps"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([s["offered_per_s"] / 1e3 for s in steps], [s["delivered_per_s"] / 1e3 for s in steps], "o-")
        ax.set_xlabel("offered k records/s")
        ax.set_ylabel("delivered k records/s")
        ax.set_title("agent: ring buffer -> gRPC")
        save(fig, "agent-records")
    if "steps" in b.get("scale", {}):
        steps = b["scale"]["steps"]
        fig, ax = plt.subplots(figsize=(6, 4))
        x = [s["offered_records_per_s"] / 1e3 for s in steps]
        ax.plot(x, [s["collector_cpu_cores"] for s in steps], "o-", label="collector CPU (cores)")
        ax.plot(x, [s["received_ratio"] for s in steps], "s-", label="received / offered")
        for s, xi in zip(steps, x, strict=True):
            ax.annotate(f"{s['agents']} agents", (xi, s["collector_cpu_cores"]))
        ax.set_xlabel("offered k records/s")
        ax.legend()
        ax.set_title("collector under N synthetic agents")
        save(fig, "scale")
    if "ratios" in b.get("overhead", {}):
        ratios = b["overhead"]["ratios"]
        metrics = list(next(iter(ratios.values())))
        fig, ax = plt.subplots(figsize=(9, 4))
        width = 0.8 / len(ratios)
        for i, (cond, per) in enumerate(ratios.items()):
            ax.bar(
                [x + i * width for x in range(len(metrics))],
                [per[m]["median"] for m in metrics],
                width,
                label=cond,
            )
        ax.set_xticks([x + 0.4 for x in range(len(metrics))], metrics)
        ax.set_ylabel("ratio to no tracing")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.set_title("overhead on the traced application")
        save(fig, "overhead")
    if b.get("accuracy", {}).get("delay"):
        d = b["accuracy"]["delay"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.errorbar(
            [r["delay_us"] for r in d],
            [r["excess_p50_ns"] / 1e3 for r in d],
            yerr=[r["excess_mad_ns"] / 1e3 for r in d],
            fmt="o-",
        )
        ax.set_xscale("log")
        ax.set_xlabel("delay box hold (µs)")
        ax.set_ylabel("hoptrace - box hold, median ± MAD (µs)")
        ax.set_title("accuracy across the delay box")
        save(fig, "accuracy")
    return made


def main() -> int:
    """Run the selected benchmarks; 0 when all ran, 1 when any failed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="every benchmark at a tiny size (about 4 minutes)")
    mode.add_argument("--full", action="store_true", help="the full sizes (20-40 minutes)")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/run.py: run as root (namespaces, BPF programs)", file=sys.stderr)
        return 2
    only = [n for n in args.only.split(",") if n]
    names = [n for n in only if n in BENCHMARKS] if only else BENCHMARKS
    smoke = [n for n in only if n in SMOKE_RUNS] if only else list(SMOKE_RUNS) if args.quick else []
    unknown = set(only) - set(BENCHMARKS) - set(SMOKE_RUNS)
    if unknown:
        print(
            f"unknown benchmarks: {sorted(unknown)}; known: {BENCHMARKS + list(SMOKE_RUNS)}", file=sys.stderr
        )
        return 2
    if smoke and not args.quick:
        print(
            f"{', '.join(smoke)}: run on their own at full size (only --quick smoke-runs them)",
            file=sys.stderr,
        )
        return 2
    ensure_matplotlib()

    # SIGTERM/SIGHUP unwind like Ctrl-C, so every benchmark's cleanup (finally blocks) runs.
    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    started = datetime.now(UTC)
    ctx = BenchContext(quick=args.quick)
    doc: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(sys.argv),
        "machine": machine(),
        "benchmarks": {},
    }
    failed = []
    t_all = time.monotonic()
    try:
        for name in names:
            log(f"== {name}")
            t0 = time.monotonic()
            try:
                result = importlib.import_module(name).run(ctx)
            except KeyboardInterrupt:
                raise
            except Exception:
                failed.append(name)
                result = {"error": traceback.format_exc()}
                log(f"{name} FAILED:\n{result['error']}")
            result["seconds"] = time.monotonic() - t0
            doc["benchmarks"][name] = result
        doc["smoke"] = smoke_runs(smoke)
        failed += [name for name, run in doc["smoke"].items() if run["returncode"] != 0]
    finally:
        ctx.close()
    doc["seconds"] = time.monotonic() - t_all
    doc["failed"] = failed

    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / started.strftime("%Y%m%dT%H%M%SZ")
    doc["plots"] = plots(doc, stem)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))
    summary = summary_markdown(doc)
    stem.with_suffix(".md").write_text(summary)
    print(summary)
    print(f"\nresults: {stem}.json, {stem}.md, plots {', '.join(doc['plots'])}; {doc['seconds']:.0f} s")
    if failed:
        print(f"FAILED benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
