"""`make demo DEMO_ARGS=--keep` prints `export` lines; pasted into a fresh shell, they are all `hoptrace
trace ls`, `hoptrace report`, `hoptrace agents` and `hoptrace version` need to work against the running demo
(whose agents' clocks the collector has measured by then)."""

from __future__ import annotations

import json
import subprocess

import pytest
from kept_demo import start_kept_demo, stop_kept_demo

pytestmark = pytest.mark.kernel  # the demo's agents load BPF here


def test_the_printed_exports_are_all_the_cli_needs() -> None:
    demo, output = start_kept_demo("--seconds", "2", "--mps", "500")
    try:
        exports = [line.rstrip("\n") for line in output if line.startswith("export ")]
        names = [line.split("=", 1)[0].removeprefix("export ") for line in exports]
        assert names == [
            "PATH",
            "HOPTRACE_DISPATCHER",
            "HOPTRACE_CA",
            "HOPTRACE_CERT",
            "HOPTRACE_KEY",
            "HOPTRACE_TOKEN_FILE",
        ], exports

        def pasted(*command: str) -> subprocess.CompletedProcess[str]:
            """`command` in a fresh shell that has only the pasted lines (no variable of this process)."""
            script = "\n".join([*exports, " ".join(command)])
            return subprocess.run(
                ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", script],
                capture_output=True,
                text=True,
                timeout=60,
            )

        listed = pasted("hoptrace", "trace", "ls")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[1].split()[:2] == ["demo-udp", "1"], listed.stdout
        report = pasted("hoptrace", "report", "demo-udp", "--since", "10m")
        assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
        lines = report.stdout.splitlines()
        assert lines[0].startswith("trace demo-udp: ") and lines[1].startswith("most time: "), lines
        assert any(line.startswith("end to end (") for line in lines), lines
        as_json = pasted("hoptrace", "report", "demo-udp", "--since", "10m", "--json")
        assert as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)
        counts = [segment["count"] for segment in data["segments"]]
        assert len(counts) == 7 and all(count > 0 for count in counts), counts  # the VXLAN path's segments
        # the slowest packets' passages, every segment of the path, each starting where the last ended
        waterfall = pasted("hoptrace", "packets", "demo-udp", "--since", "10m", "--slowest", "3", "--json")
        assert waterfall.returncode == 0, waterfall.stderr
        slowest = json.loads(waterfall.stdout)
        assert len(slowest) == 3 and all(len(p["segments"]) == 7 for p in slowest), slowest
        assert [p["end_to_end_ns"] for p in slowest] == sorted(
            (p["end_to_end_ns"] for p in slowest), reverse=True
        )
        for packet in slowest:
            steps = packet["segments"]
            assert all(
                b["offset_ns"] == a["offset_ns"] + a["latency_ns"]
                for a, b in zip(steps, steps[1:], strict=False)
            )
            assert steps[-1]["offset_ns"] + steps[-1]["latency_ns"] == packet["end_to_end_ns"]

        # the agents' clocks as the collector measured them during the flow: real numbers, not zeros
        agents = pasted("hoptrace", "agents", "--json")
        assert agents.returncode == 0, agents.stderr
        clocks = {agent["node"]: agent["clock"] for agent in json.loads(agents.stdout)}
        assert set(clocks) == {"host-a", "host-b"}, clocks
        for clock in clocks.values():
            assert clock["measured"] and clock["bound_ns"] > 0 and clock["measured_at"], clocks
        table = pasted("hoptrace", "agents")
        assert table.returncode == 0 and "unknown" not in table.stdout and "±" in table.stdout, table.stdout
        version = pasted("hoptrace", "version", "--json")
        assert version.returncode == 0, version.stderr
        versions = json.loads(version.stdout)
        assert versions["dispatcher"]["api"] == "hoptrace.v1" and not versions["dispatcher"]["error"], (
            versions
        )
        assert set(versions["agents"]) == {"host-a", "host-b"}, versions

        # without the lines, the same command cannot reach the demo's dispatcher
        bare = subprocess.run(
            ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", f"{exports[0]}\nhoptrace trace ls"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bare.returncode == 1 and "Traceback" not in bare.stderr, bare.stderr
    finally:
        stop_kept_demo(demo)
