"""`make demo`: two emulated hosts, a traced UDP flow over VXLAN, and where its time goes, hop by hop.

Builds the test topology (container c1 on host-a, container c2 on host-b, VXLAN between them), starts
InfluxDB, the collector, the dispatcher and one agent per host, applies a trace for a sockperf flow
c1 -> c2, runs it for a while, prints the report, and removes everything it created.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hoptrace.common.client import ApiClient
from hoptrace.common.entry import ArgumentParser, run_command
from hoptrace.common.timeouts import scaled
from hoptrace.lab.localcluster import BPF_CACHE_DIR, LocalCluster, writable_bpf_cache
from hoptrace.lab.processes import start_influxd
from hoptrace.lab.reference import SOCKPERF_PORT, vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology, netns_list
from hoptrace.lab.workloads import sockperf, wait_listening
from hoptrace.results.report_view import render_text, report_from_proto
from hoptrace.spec import spec_to_yaml
from hoptrace.v1 import trace_pb2

# sockperf's count of the messages its client sent in the whole run (warm-up included): the datagrams
# c1 sent to c2, each of which the trace follows.
_SENT_MESSAGES = re.compile(r"\[Total Run\].*\bSentMessages=(\d+)")


# The demo's trace: the sockperf flow c1 -> c2 on every hop of the VXLAN path.
TRACE = "demo-udp"


def demo_spec(topo: TwoHostTopology) -> trace_pb2.TraceSpec:
    """The trace the demo applies on `topo` (its BPF objects depend on the hops' attach kinds only)."""
    return vxlan_path_spec(topo, TRACE)


# The demo's namespaces: htdemo-a, htdemo-b (the hosts), htdemo-c1, htdemo-c2 (a container on each). Fixed,
# so that the specs of examples/ name them and run against the demo as they are.
DEMO_PREFIX = "htdemo"


def serve_traffic(topo: TwoHostTopology) -> None:
    """The sockperf servers a kept demo leaves up for the user's traffic (traffic_commands): UDP and TCP in
    c2, UDP on host-b's wire address, each on SOCKPERF_PORT; topo.destroy() stops them."""
    for role, proto in (("c2", "udp"), ("c2", "tcp"), ("host-b", "udp")):
        tcp = ["--tcp"] if proto == "tcp" else []
        topo.popen(
            role, "sockperf", "server", *tcp, "-i", topo.addr(role), "-p", str(SOCKPERF_PORT),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_listening(topo, role, proto, SOCKPERF_PORT)


def traffic_commands(topo: TwoHostTopology) -> list[str]:
    """Shell lines (as root) that send 3 s of sockperf ping-pong through the kept demo's path, to the
    servers of serve_traffic(): UDP and TCP c1 -> c2, and UDP host-a -> host-b on the wire."""
    lines = []
    for client, server, tcp in (("c1", "c2", ""), ("c1", "c2", "--tcp "), ("host-a", "host-b", "")):
        lines.append(
            f"ip netns exec {topo.netns(client)} sockperf ping-pong {tcp}-i {topo.addr(server)}"
            f" -p {SOCKPERF_PORT} --mps 1000 -t 3"
        )
    return lines


# The report covers the last 5 minutes (`hoptrace report demo-udp --since 5m`): the demo's whole flow.
REPORT_SINCE_S = 300


class _Stopped(Exception):
    """SIGTERM arrived."""


def _stop_on_signal(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one teardown, even if the signal comes again
    raise _Stopped


def run_sockperf(topo: TwoHostTopology, seconds: float, mps: int) -> tuple[int, str]:
    """A sockperf UDP ping-pong c1 -> c2; returns the datagrams c1 sent and the client's summary lines."""
    out = sockperf(topo, "ping-pong", seconds, "--mps", str(mps))
    sent = _SENT_MESSAGES.search(out)
    if not sent:
        raise RuntimeError(f"sockperf did not say how many messages it sent:\n{out[-2000:]}")
    summary = [line for line in out.splitlines() if "avg-latency" in line or "Summary" in line]
    return int(sent.group(1)), "\n".join(summary)


def wait_for_report(
    cluster: LocalCluster, trace: str, packets: int, timeout_s: float = 30.0
) -> dict[str, Any]:
    """The trace's report (as `hoptrace report --json` has it) once it accounts for `packets` packets,
    complete or not, and every segment for every complete one: the collector's join window has closed on
    the last packet and the windows of its segments are in InfluxDB (a second's window is written after
    the packet counts that reach it). After `timeout_s` (scaled), the report as it stands: its counts then
    show what is missing."""
    deadline = time.monotonic() + scaled(timeout_s)
    client = ApiClient(cluster.dispatcher_addr, cluster.channel)
    while True:
        cluster.check_running()
        report = report_from_proto(client.report(trace, REPORT_SINCE_S))
        segments = [*report["segments"], report["end_to_end"]]
        accounted = report["packets"] >= packets and all(s["count"] >= report["complete"] for s in segments)
        if accounted or time.monotonic() > deadline:
            return report
        time.sleep(0.2)  # the collector writes a window per second: poll a few times within one


def shell_exports(variables: dict[str, str]) -> str:
    """`export NAME=VALUE` lines a POSIX shell takes as they are (values quoted; `$PATH` left to expand)."""
    lines = []
    for name, value in variables.items():
        if value.endswith(":$PATH"):
            text = shlex.quote(value.removesuffix(":$PATH")) + ':"$PATH"'
        else:
            text = shlex.quote(value)
        lines.append(f"export {name}={text}")
    return "\n".join(lines)


def say(text: str) -> None:
    """Print a demo step."""
    print(f"\n== {text}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; with --keep, leave everything up until Ctrl-C."""
    parser = ArgumentParser(prog="hoptrace demo", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10, help="how long the traced flow runs")
    parser.add_argument("--mps", type=int, default=1000, help="sockperf messages per second")
    parser.add_argument("--keep", action="store_true", help="keep everything up until Ctrl-C")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("hoptrace demo: run as root (it creates namespaces and loads BPF programs)", file=sys.stderr)
        return 1
    for tool in ("sockperf", "ip", "clang"):
        if not shutil.which(tool):
            print(f"hoptrace demo: {tool} is missing: run `make setup`", file=sys.stderr)
            return 1

    # SIGTERM (kill PID, systemd, docker stop) tears down like Ctrl-C: the finally block below runs.
    signal.signal(signal.SIGTERM, _stop_on_signal)
    # Ctrl-C too, even when started with SIGINT ignored (a shell starts a background job so without job
    # control, and Python then keeps it ignored): "Ctrl-C stops and cleans up" must hold.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    influx = None
    cluster = None
    topo = TwoHostTopology(DEMO_PREFIX, overlay="vxlan")
    running = sorted(set(topo.namespaces) & set(netns_list()))
    if running:
        print(
            f"hoptrace demo: a demo runs already (namespaces {', '.join(running)}): stop it (Ctrl-C), or"
            " remove a killed one's with `ip netns del NAME`",
            file=sys.stderr,
        )
        return 1
    try:
        say("two emulated hosts: c1 on host-a, c2 on host-b, VXLAN between them")
        # The namespaces are built while influxd starts: on a slow machine (a TCG guest) each takes a minute.
        # influxd is started by this thread: it dies with the thread that started it (PDEATHSIG).
        with ThreadPoolExecutor(max_workers=1) as background:
            built = background.submit(topo.create)
            try:
                influx = start_influxd()
            finally:
                built.result()
        print(f"namespaces: {', '.join(topo.namespaces)}")

        say("InfluxDB, collector, dispatcher, one agent per host, web UI")
        # Compiled objects kept in .tools/bpf-cache between demos (and shared with a guest's demo, lab/vm.py):
        # a second demo applies without clang.
        cluster = LocalCluster(influx_url=influx.url, bpf_cache_dir=writable_bpf_cache(BPF_CACHE_DIR))
        cluster.start_on(topo)
        # The web UI starts now and is waited for last: its start-up overlaps the trace.
        password = secrets.token_urlsafe(9)
        _, web_url = cluster.start_web(password)
        print(
            f"dispatcher {cluster.dispatcher_addr}, collector {cluster.collector_addr}, influxdb {influx.url}"
        )

        spec = demo_spec(topo)
        say("trace spec (hoptrace trace apply -f SPEC.yaml)")
        print(spec_to_yaml(spec))
        started = time.monotonic()
        trace = cluster.apply(spec)
        print(f"applied generation {trace.generation} in {time.monotonic() - started:.2f} s")

        say(f"sockperf UDP ping-pong c1 -> c2 for {args.seconds:g} s at {args.mps} msg/s")
        sent, summary = run_sockperf(topo, args.seconds, args.mps)
        print(summary)
        print(f"c1 sent {sent} datagrams to c2")

        say(f"where the time went (hoptrace report {TRACE} --since 5m)")
        print(render_text(wait_for_report(cluster, TRACE, sent)))
        cluster.wait_http(web_url + "/login")
        say(f"web UI: {web_url}  (login admin / {password}; results at {web_url}/traces/{TRACE}/results)")
        if not args.keep:
            print("it stops with the demo now; `make demo DEMO_ARGS=--keep` keeps everything up until Ctrl-C")
        if args.keep:
            say("the CLI against this demo: paste these lines into another shell (as root), then run")
            print(shell_exports(cluster.client_exports()))
            commands = ["trace ls", f"report {TRACE}", f"packets {TRACE} --slowest 3", "agents"]
            print("\n".join(f"hoptrace {command}" for command in commands), flush=True)
            serve_traffic(topo)
            say(
                "traffic through the demo's path, for a trace of examples/ or `hoptrace discover` to see (as"
                " root, while it runs): UDP c1 -> c2, TCP c1 -> c2, UDP host-a -> host-b"
            )
            print("\n".join(traffic_commands(topo)), flush=True)
            say(
                f"everything stays up (dispatcher {cluster.dispatcher_addr}); Ctrl-C stops and cleans up, and"
                f" leaves {cluster.workdir}: the logs, and the CA's key, certificates and tokens (secrets)"
            )
            # Not signal.pause(): a signal landing between the interpreter's check before that call and
            # pause(2) itself would wait for the next one. A 1 s sleep handles it within a second.
            while True:
                time.sleep(1)
        return 0
    except KeyboardInterrupt:
        return 130
    except _Stopped:
        return 143
    except Exception as err:  # the demo reports what failed, with the component's log, then cleans up
        print(f"hoptrace demo failed: {err}", file=sys.stderr)
        if cluster:
            for component in cluster.components.values():
                print(f"--- {component.name} log:\n{component.log_tail(15)}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        say("cleaning up")
        if cluster:
            cluster.stop()
        if influx:
            influx.stop()
        topo.destroy()
        if cluster and args.keep:
            print(
                f"left {cluster.workdir}: the components' logs, and the CA's key, certificates and tokens"
                f" (secrets): `rm -r {cluster.workdir}` when done with them"
            )
        elif cluster:
            shutil.rmtree(cluster.workdir, ignore_errors=True)  # the CA's key and every token among them


if __name__ == "__main__":
    sys.exit(run_command(main))
