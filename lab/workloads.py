"""Traffic for the lab's topologies: sockperf between two namespaces, started and stopped one way only."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from hoptrace.common.timeouts import scaled
from hoptrace.lab.reference import SOCKPERF_PORT
from hoptrace.lab.topology import TwoHostTopology


def wait_listening(topo: TwoHostTopology, role: str, proto: str, port: int, timeout_s: float = 5.0) -> None:
    """Wait until something listens on `port` (tcp/udp) inside `role`'s namespace (`timeout_s` scaled)."""
    deadline = time.monotonic() + scaled(timeout_s)
    flag = "-tln" if proto == "tcp" else "-uln"
    while time.monotonic() < deadline:
        out = topo.run(role, "ss", "-H", flag, check=False).stdout
        if re.search(rf":{port}\b", out):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {proto}/{port} in {role}")


def sockperf(
    topo: TwoHostTopology,
    mode: str,
    seconds: float,
    *client_args: str,
    client: str = "c1",
    server: str = "c2",
    port: int = SOCKPERF_PORT,
    server_prefix: Sequence[str] = (),
    client_prefix: Sequence[str] = (),
    on_server_up: Callable[[int], None] | None = None,
) -> str:
    """Run ``sockperf MODE`` (ping-pong, throughput, under-load) from `client` to a sockperf server in
    `server` for `seconds`; returns the client's output (stdout and stderr). The server is up before the
    client starts and gone when this returns. `*_prefix`: a command before sockperf (e.g. taskset), each
    exec'ing the next, so the server's pid is sockperf's; `on_server_up(pid)` runs once it listens, before
    the client starts (e.g. to trace that process)."""
    srv = topo.popen(
        server, *server_prefix, "sockperf", "server", "-i", topo.addr(server), "-p", str(port),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening(topo, server, "udp", port)
        if on_server_up is not None:
            on_server_up(srv.pid)
        out = topo.run(
            client, *client_prefix, "sockperf", mode, "-i", topo.addr(server), "-p", str(port),
            "-t", str(int(seconds)), *client_args, timeout=seconds + scaled(30), check=False,
        )  # fmt: skip
    finally:
        srv.send_signal(signal.SIGINT)
        try:
            srv.wait(5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    return out.stdout + out.stderr
