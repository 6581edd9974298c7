"""`make demo`: two emulated hosts, a traced UDP flow over VXLAN, and where its time goes, hop by hop.

Builds the test topology (container c1 on host-a, container c2 on host-b, VXLAN between them), starts
InfluxDB, the collector, the dispatcher and one agent per host, applies a trace for a sockperf flow
c1 -> c2, runs it for a while, prints the report, and removes everything it created.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Sequence

from hoptrace.common.timeouts import scaled
from hoptrace.dispatcher.spec import spec_to_yaml
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.processes import start_influxd
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.lab.workloads import sockperf


class _Stopped(Exception):
    """SIGTERM arrived."""


def _stop_on_signal(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one teardown, even if the signal comes again
    raise _Stopped


def run_sockperf(topo: TwoHostTopology, seconds: float, mps: int) -> str:
    """A sockperf UDP ping-pong c1 -> c2; returns the client's summary lines."""
    out = sockperf(topo, "ping-pong", seconds, "--mps", str(mps))
    return "\n".join(line for line in out.splitlines() if "avg-latency" in line or "Summary" in line)


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
    parser = argparse.ArgumentParser(prog="hoptrace demo", description=__doc__)
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
    influx = None
    cluster = None
    topo = TwoHostTopology(f"htdemo{os.getpid() % 1000}", overlay="vxlan")
    try:
        say("two emulated hosts: c1 on host-a, c2 on host-b, VXLAN between them")
        topo.create()
        print(f"namespaces: {', '.join(topo.namespaces)}")

        say("InfluxDB, collector, dispatcher, one agent per host")
        influx = start_influxd()
        cluster = LocalCluster(influx_url=influx.url)
        cluster.start_on(topo)
        print(
            f"dispatcher {cluster.dispatcher_addr}, collector {cluster.collector_addr}, influxdb {influx.url}"
        )

        spec = vxlan_path_spec(topo, "demo-udp")
        say("trace spec (hoptrace trace apply -f SPEC.yaml)")
        print(spec_to_yaml(spec))
        started = time.monotonic()
        trace = cluster.apply(spec)
        print(f"applied generation {trace.generation} in {time.monotonic() - started:.2f} s")

        say(f"sockperf UDP ping-pong c1 -> c2 for {args.seconds:g} s at {args.mps} msg/s")
        print(run_sockperf(topo, args.seconds, args.mps))
        time.sleep(scaled(3))  # the collector's join window closes and the last points reach InfluxDB

        say("where the time went (hoptrace report demo-udp)")
        report = cluster.hoptrace("report", "demo-udp", "--since", "5m", check=False)
        print(report.stdout or report.stderr)
        password = secrets.token_urlsafe(9)
        _, web_url = cluster.start_web(password)
        cluster.wait_http(web_url + "/login")
        say(f"web UI: {web_url}  (login admin / {password}; results at {web_url}/traces/demo-udp/results)")
        if not args.keep:
            print("it stops with the demo now; `make demo DEMO_ARGS=--keep` keeps everything up until Ctrl-C")
        if args.keep:
            say("the CLI against this demo: paste these lines into another shell (as root), then run")
            print(shell_exports(cluster.client_exports()))
            commands = ["trace ls", "report demo-udp", "packets demo-udp --slowest 3", "agents"]
            print("\n".join(f"hoptrace {command}" for command in commands), flush=True)
            say(f"everything stays up (dispatcher {cluster.dispatcher_addr}); Ctrl-C stops and cleans up")
            signal.pause()
        return report.returncode
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


if __name__ == "__main__":
    sys.exit(main())
