"""Iron on a real kernel: a network-heavy container and a CPU-bound victim on one CPU, accounted for 4 s."""

from __future__ import annotations

import importlib.util
import secrets
import subprocess
import sys
from pathlib import Path

from hoptrace.cli.iron import run_iron

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "iron_penalty.py"
_spec = importlib.util.spec_from_file_location("iron_penalty", _BENCH)
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_neighbour_causes_and_victim_is_charged(iron_object: Path) -> None:
    """The traffic container causes softirq time; the victim is charged more than it causes (none)."""
    with bench.testbed("hi" + secrets.token_hex(2)) as names:
        victim = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                names["victim"],
                "taskset",
                "-c",
                bench.VICTIM_CPU,
                sys.executable,
                "-c",
                bench.SPIN,
                str(10**12),
            ]
        )
        try:
            with bench.traffic_neighbour(names):
                report = run_iron(4.0)
        finally:
            victim.kill()
            victim.wait()
    by_name = {c["container"]: c for c in report["containers"]}
    assert names["nbr"] in by_name, list(by_name)
    assert by_name[names["nbr"]]["caused_ns"] > 0 and by_name[names["nbr"]]["packets"] > 0
    assert names["victim"] in by_name, f"victim never interrupted: {list(by_name)}"
    v = by_name[names["victim"]]
    assert v["charged_ns"] > v["caused_ns"], v
    assert v["diff_ns"] > 0
