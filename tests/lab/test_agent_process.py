"""The AgentProcess helper, driven by a stand-in agent that speaks the standalone agent's JSON lines."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from hoptrace.lab.processes import AgentProcess

FAKE_AGENT = textwrap.dedent(
    """\
    import json, signal, sys, time
    args = sys.argv[1:]
    assert args[0] == "run" and "--plan" in args and args[args.index("--out") + 1] == "-", args
    plan = json.load(open(args[args.index("--plan") + 1]))
    node = args[args.index("--node") + 1]
    stop = False
    def on_signal(*_):
        global stop
        stop = True
    signal.signal(signal.SIGINT, on_signal)
    def emit(obj):
        print(json.dumps(obj), flush=True)
    emit({"type": "status", "trace": plan["trace"], "active": True,
          "hops": [{"hopIndex": 0, "name": node, "attached": True}]})
    print("not json", flush=True)
    n = 0
    while not stop:
        n += 1
        emit({"type": "record", "trace": plan["trace"], "hop": "h0", "hop_index": 0, "packet_id": n,
              "flow_hash": 7, "ts_ns": time.monotonic_ns(), "ifindex": 2, "wire_len": 100, "cpu": 0,
              "flags": 4})
        if n % 5 == 0:
            emit({"type": "counters", "trace": plan["trace"], "hop": "h0", "hop_index": 0, "seen": n})
        time.sleep(0.01)
    emit({"type": "counters", "trace": plan["trace"], "hop": "h0", "hop_index": 0, "seen": n, "final": True})
    sys.exit(int(plan.get("exit_code", 0)))
    """
)


def fake_agent(tmp_path: Path) -> Path:
    """An executable stand-in for hoptrace-agent."""
    path = tmp_path / "fake-agent"
    path.write_text(f"#!{sys.executable}\n{FAKE_AGENT}")
    path.chmod(0o755)
    return path


def test_agent_process_collects_lines_and_stops_cleanly(tmp_path: Path) -> None:
    with AgentProcess(fake_agent(tmp_path), {"trace": "t1"}, node="host-a", netns="x") as agent:
        assert agent.command[-2:] == ["--netns", "x"]
        assert json.loads(agent.plan_path.read_text()) == {"trace": "t1"}
        status = agent.wait_status(timeout_s=10)
        assert status["trace"] == "t1" and status["hops"][0]["attached"]
        records = agent.wait_records(10, timeout_s=10, predicate=lambda r: r["flags"] == 4)
        assert [r["packet_id"] for r in records[:3]] == [1, 2, 3]
        agent.wait_counters()
        assert agent.stop() == 0
    assert agent.counters[-1]["final"] is True
    assert agent.other_lines == ["not json"]
    assert not agent.plan_path.exists()  # the plan file and stderr log are removed on exit


def test_agent_process_reports_a_bad_exit(tmp_path: Path) -> None:
    agent = AgentProcess(fake_agent(tmp_path), {"trace": "t2", "exit_code": 3}, node="n").start()
    try:
        agent.wait_status(timeout_s=10)
        with pytest.raises(AssertionError, match="exited with 3"):
            agent.stop()
    finally:
        agent.cleanup()


def test_agent_process_fails_when_output_ends_without_status(tmp_path: Path) -> None:
    broken = tmp_path / "broken-agent"
    broken.write_text("#!/bin/sh\necho 'cannot load object' >&2\nexit 1\n")
    broken.chmod(0o755)
    agent = AgentProcess(broken, {"trace": "t3"}, node="n").start()
    try:
        with pytest.raises(AssertionError, match="cannot load object"):
            agent.wait_status(timeout_s=10)
    finally:
        agent.cleanup()
