"""Every spec of examples/ runs against the demo as examples/README.md shows: `make demo DEMO_ARGS=--keep`
(one demo for all of them), its printed `export` lines in a fresh shell, then per spec the README's lines
verbatim (apply, the demo's printed traffic line, report, rm), and each report holds what its spec traces:
packets on every segment, counts of its events. `hoptrace discover` during the demo's traffic finds the
path. The README's commands are the examples' ones. The examples named namespaces `c1`, `c2` that the demo
did not make (its names carried its pid), one said `trace apply` without `-f`, and nothing said how to send
traffic through the demo's path."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kept_demo import start_kept_demo, stop_kept_demo

from hoptrace.common.timeouts import scaled
from hoptrace.spec import load_spec

pytestmark = pytest.mark.kernel  # the demo's agents load BPF here

REPO = Path(__file__).resolve().parents[2]
APPLY = re.compile(r"^hoptrace trace apply -f (examples/\S+)$")


def shell_blocks(markdown: str) -> list[list[str]]:
    """The ```sh blocks of a Markdown text, each as its lines without comments."""
    blocks = re.findall(r"```sh\n(.*?)```", markdown, re.S)
    return [[line.split("  #")[0].rstrip() for line in block.splitlines()] for block in blocks]


def groups(lines: list[str]) -> list[list[str]]:
    """Lines in groups, split at blank lines."""
    out: list[list[str]] = [[]]
    for line in lines:
        if line:
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [group for group in out if group]


def holds_what_it_traces(report: dict[str, Any], spec: Any) -> str:
    """Why the report of `spec` is not yet what its traffic makes ("" when it is): a packet count and every
    segment counted for a path, at least one of its events counted for event probes."""
    if spec.hops and (report["packets"] == 0 or not all(s["count"] > 0 for s in report["segments"])):
        return f"packets {report['packets']}, segments {[s['count'] for s in report['segments']]}"
    # Some events may see nothing while the example's traffic runs (a NET_TX softirq is the machine's, not
    # the flow's): the report must count at least one of the spec's events, and only the spec's.
    events = {e["name"]: e for e in report["events"]}
    if not events.keys() <= {event.name for event in spec.events}:
        return f"events of another spec: {sorted(events)}"
    counted = [
        name
        for name, found in events.items()
        if found["count"] > 0 or found["recorded"] or found["histogram"]
    ]
    if spec.events and not counted:
        return f"no event of {[event.name for event in spec.events]} counted: {events}"
    return ""


def test_every_example_runs_against_the_demo_as_its_readme_says() -> None:
    examples_readme = (REPO / "examples" / "README.md").read_text()
    runs, discover_block = shell_blocks(examples_readme)
    specs = sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "examples").rglob("*")
        if path.suffix in (".yaml", ".json")
    )
    applied = [APPLY.match(group[0]).group(1) for group in groups(runs)]
    assert sorted(applied) == specs, "examples/README.md must run every spec of examples/"
    # The front page's commands are the examples' own.
    front = [line for block in shell_blocks((REPO / "README.md").read_text()) for line in block]
    assert groups(runs)[0][:3] == front[front.index(groups(runs)[0][0]) :][:3]
    assert any(line.startswith(discover_block[0].removesuffix(" &")) for line in front), discover_block

    demo, output = start_kept_demo("--seconds", "2", "--mps", "500", cwd=REPO)
    try:
        exports = [line.rstrip("\n") for line in output if line.startswith("export ")]
        traffic = {line.rstrip("\n") for line in output if line.startswith("ip netns exec ")}
        used = {line for line in [*runs, *discover_block] if line.startswith("ip netns exec ")}
        assert used and used <= traffic, f"the README's traffic lines are the demo's: {used - traffic}"

        def pasted(line: str) -> subprocess.CompletedProcess[str]:
            """`line` in a fresh shell that has only the demo's pasted exports, in the checkout."""
            return subprocess.run(
                [
                    "env",
                    "-i",
                    "PATH=/usr/bin:/bin:/usr/sbin:/sbin",
                    "bash",
                    "-c",
                    "\n".join([*exports, line]),
                ],
                capture_output=True,
                text=True,
                timeout=scaled(120),
                cwd=REPO,
            )

        for group in groups(runs):
            spec = load_spec((REPO / APPLY.match(group[0]).group(1)).read_text())
            for line in group:
                done = pasted(line)
                assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
                if line.startswith("hoptrace report "):
                    # What the traffic left, once the collector has written its windows.
                    deadline, why = time.monotonic() + scaled(30), "not read"
                    while True:
                        answer = pasted(f"hoptrace report {spec.name} --since 5m --json")
                        assert answer.returncode == 0, answer.stderr
                        why = holds_what_it_traces(json.loads(answer.stdout), spec)
                        if not why or time.monotonic() > deadline:
                            break
                        time.sleep(0.5)
                    assert not why, f"{spec.name}: {why}"

        discover = subprocess.Popen(
            ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", "\n".join([*exports, discover_block[0][:-2]])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for line in discover_block[1:-1]:  # the traffic, then `wait`
            assert pasted(line).returncode == 0, line
        found, progress = discover.communicate(timeout=scaled(60))
        assert discover.returncode == 0, progress
        path = load_spec(found)
        assert [hop.node for hop in path.hops[:1]] == ["host-a"], (found, progress)
        assert {hop.node for hop in path.hops} == {"host-a", "host-b"}, (found, progress)
    finally:
        stop_kept_demo(demo)
