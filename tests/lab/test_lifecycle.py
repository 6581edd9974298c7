"""The demo (a LocalCluster on a two-host topology) stopped as users stop things: SIGTERM, SIGINT, or
SIGKILL. Afterwards no process, network namespace, BPF link or tc filter of it is left."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kept_demo import start_kept_demo

from hoptrace.cli.demo import DEMO_PREFIX
from hoptrace.common.timeouts import scaled
from hoptrace.lab.topology import netns_list
from hoptrace.lab.waiting import wait_until

pytestmark = pytest.mark.kernel  # the demo's agents load BPF here


def hoptrace_links() -> list[dict]:
    """BPF links whose program is one of hoptrace's (bpftool's view of the whole machine)."""

    def bpftool(*args: str) -> list[dict]:
        return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True).stdout)

    links, progs = bpftool("link", "list"), bpftool("prog", "list")
    ours = {p["id"] for p in progs if p.get("name", "").startswith(("hop_", "tag_tcp"))}
    return [link for link in links if link.get("prog_id") in ours]


def descendants(root: int) -> set[int]:
    """Every live process below `root` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (zombies count as gone)."""
    running = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.add(pid)
        except OSError:
            continue
    return running


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_demo_leaves_nothing_behind(sig: signal.Signals) -> None:
    links_before = {link["id"] for link in hoptrace_links()}
    demo, output = start_kept_demo("--seconds", "1", "--mps", "200")
    prefix = f"{DEMO_PREFIX}-"
    try:
        assert any(name.startswith(prefix) for name in netns_list()), "the demo's namespaces are not there"
        assert hoptrace_links(), "the agents attached nothing"

        children = descendants(demo.pid)
        assert len(children) >= 6, children  # influxd, dispatcher, collector, two agents, web
        demo.send_signal(sig)
        # The teardown is bounded, not instant: each of five components gets 10 s to stop on SIGTERM and
        # 5 more after SIGKILL, influxd 10 s (LocalCluster.stop). CI once saw SIGINT's take over 60 s.
        demo.wait(scaled(120))
        rest = demo.stdout.read()
        if sig != signal.SIGKILL:
            assert "cleaning up" in rest and demo.returncode in (130, 143), rest[-2000:]
            # kept: its directory stays, said to hold secrets (the CA's key, every token), not in silence
            kept = re.search(r"^left (/\S+): .*\(secrets\)", rest, re.M)
            assert kept and (Path(kept.group(1)) / "certs").is_dir(), rest[-2000:]
            shutil.rmtree(kept.group(1))
        # after SIGKILL the children die with it (PDEATHSIG) and the reaper removes the namespaces
        wait_until(lambda: not [n for n in netns_list() if n.startswith(prefix)], "namespaces deleted", 30)
        wait_until(lambda: not alive(children), f"the demo's processes gone: {alive(children)}", 30)
        wait_until(lambda: {link["id"] for link in hoptrace_links()} <= links_before, "links gone", 30)
        tc = subprocess.run(["tc", "filter", "show", "dev", "lo", "egress"], capture_output=True, text=True)
        assert "hop_" not in tc.stdout
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for name in netns_list():
            if name.startswith(prefix):
                subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_demo_not_kept_removes_its_directory(tmp_path: Path) -> None:
    """Its files (logs, the CA's key, every token: 20 MB) stayed in /tmp/hoptrace-cluster-*, unsaid."""
    demo = subprocess.run(
        [sys.executable, "-m", "hoptrace.cli.demo", "--seconds", "1", "--mps", "200"],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-3000:]
    assert "where the time went" in demo.stdout
    assert list(tmp_path.glob("hoptrace-cluster-*")) == []
