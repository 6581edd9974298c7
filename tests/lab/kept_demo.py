"""The demo kept up (`hoptrace demo --keep`), as the tests of tests/lab start it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from hoptrace.cli.demo import DEMO_PREFIX
from hoptrace.lab.topology import netns_list

# The line the demo prints once everything is up.
READY = "everything stays up"


def start_kept_demo(*args: str, cwd: Path | None = None) -> tuple[subprocess.Popen[str], list[str]]:
    """`hoptrace demo --keep ARGS`, read until it says everything is up (nothing is slept on): the process,
    still running, and the lines it printed so far. The caller stops it."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "hoptrace.cli.demo", "--keep", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
    )
    output: list[str] = []
    assert demo.stdout is not None
    for line in demo.stdout:
        output.append(line)
        if READY in line:
            break
    assert any(READY in line for line in output), "".join(output[-40:])
    return demo, output


def stop_kept_demo(demo: subprocess.Popen[str]) -> None:
    """Stop a kept demo as Ctrl-C would (SIGTERM: it cleans up), killed if it takes over a minute, and
    delete any namespace of the demo's that is left."""
    if demo.poll() is None:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()
    for name in netns_list():
        if name.startswith(f"{DEMO_PREFIX}-"):
            subprocess.run(["ip", "netns", "del", name], check=False)
