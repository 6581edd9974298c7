"""An on-path attacker on the clock exchange, on the real system (mutual TLS, the VXLAN topology, real
traffic): each agent reaches the collector's time service through a UDP relay of this test's, standing where a
router or an ARP spoofer would. The collector and every agent run on this machine, so the true offset of
every node is 0 and whatever hoptrace measures beyond it is error.

- host-a authenticates its rounds (the default with mutual TLS: its key comes from the collector over its
  gRPC connection). The relay rewrites each reply's T2 and T3 by +5 ms: every such reply is refused and
  counted, no round is taken from them, and host-a's offset stays within its bound of 0. Then the relay only
  holds the requests 2 ms (one direction): authentication cannot see that, and Cristian's estimate moves by
  half of it, but its bound grows by as much: the truth stays within it, and nothing is flagged.
- host-b runs unauthenticated (--clock-auth off, the lab mode without keys). The same rewrite moves its offset
  by -5 ms: the collector flags the jump, `hoptrace agents` shows it, and the report's segments across host-b
  carry the note.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import selectors
import socket
import struct
import threading
import time

from hoptrace.collector.timeservice import ns_of_ntp_fixed, ntp_fixed
from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.prometheus import scrape
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until

SHIFT_NS = 5_000_000
HOLD_REQUESTS_S = 0.002
CLOCK_FLAGS = ["--clock-interval", "1s", "--clock-probes", "20"]
CROSS_HOST = "a-wire-out > b-wire-in"


class ClockRelay:
    """A UDP relay in front of the time service: requests go on (held `hold_requests_s` first), replies
    come back with T2 and T3 moved by `shift_ns` (their MAC, if any, left as it was)."""

    def __init__(self, server: str) -> None:
        host, port = server.rsplit(":", 1)
        self.server = (host, int(port))
        self.shift_ns = 0
        self.hold_requests_s = 0.0
        self.down = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.down.bind(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.down.getsockname()[1]}"
        self.rewritten = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.down, selectors.EVENT_READ, None)
        upstream: dict[tuple[str, int], socket.socket] = {}  # agent's socket -> ours toward the server
        due: list[tuple[float, int, socket.socket, bytes]] = []  # held requests
        seq = 0
        while not self._stop.is_set():
            timeout = max(0.0, due[0][0] - time.monotonic()) if due else 0.1
            for key, _ in sel.select(min(timeout, 0.1)):
                if key.data is None:  # a request
                    data, client = self.down.recvfrom(512)
                    if client not in upstream:
                        upstream[client] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        sel.register(upstream[client], selectors.EVENT_READ, client)
                    seq += 1
                    heapq.heappush(
                        due, (time.monotonic() + self.hold_requests_s, seq, upstream[client], data)
                    )
                else:  # a reply, for the agent socket key.data
                    data = bytearray(key.fileobj.recv(512))
                    if self.shift_ns and len(data) >= 48:
                        t2, t3 = struct.unpack_from("!QQ", data, 32)
                        struct.pack_into(
                            "!QQ",
                            data,
                            32,
                            ntp_fixed(ns_of_ntp_fixed(t2) + self.shift_ns),
                            ntp_fixed(ns_of_ntp_fixed(t3) + self.shift_ns),
                        )
                        self.rewritten += 1
                    self.down.sendto(bytes(data), key.data)
            while due and due[0][0] <= time.monotonic():
                _, _, sock, data = heapq.heappop(due)
                sock.sendto(data, self.server)
        for sock in upstream.values():
            sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.down.close()


def clocks(cluster: LocalCluster) -> dict[str, dict]:
    """Each node's clock as `hoptrace agents --json` shows it."""
    return {a["node"]: a["clock"] for a in json.loads(cluster.hoptrace("agents", "--json").stdout)}


def send(topology, count: int) -> None:
    payloads = [os.urandom(64) for _ in range(count)]
    assert len(udp_transfer(topology, "c1", "c2", payloads, 4, 11111, 0.001)) == count


def test_forged_clock_replies_are_refused_and_an_unauthenticated_jump_is_flagged(topology, influxd):
    with LocalCluster(influx_url=influxd.url) as cluster:
        relay_a, relay_b = ClockRelay(cluster.clock_addr), ClockRelay(cluster.clock_addr)
        try:
            cluster.start_on(
                topology,
                ["--join-window", "1"],
                {
                    "host-a": ["--clock-server", relay_a.addr, *CLOCK_FLAGS],
                    "host-b": ["--clock-server", relay_b.addr, "--clock-auth", "off", *CLOCK_FLAGS],
                },
            )
            agent_a, agent_b = cluster.metrics_addr("agent-host-a"), cluster.metrics_addr("agent-host-b")
            collector = cluster.metrics_addr("collector")

            def rounds(addr: str) -> float:
                return scrape(addr)["hoptrace_agent_clock_rounds_total"]

            # Three honest rounds each: an estimate, and a drift from the fit.
            wait_until(lambda: min(rounds(agent_a), rounds(agent_b)) >= 3, "three clock rounds each", 20)
            a = scrape(agent_a)
            assert a["hoptrace_agent_clock_authenticated"] == 1 and a["hoptrace_agent_clock_key_valid"] == 1
            assert scrape(agent_b)["hoptrace_agent_clock_authenticated"] == 0
            assert "WARNING: clock rounds are NOT authenticated (--clock-auth off)" in (
                cluster.components["agent-host-b"].log_path.read_text()
            )
            assert scrape(collector)["hoptrace_collector_time_requests_authenticated_total"] >= 60
            cluster.apply(vxlan_path_spec(topology, "clk-attack"))
            send(topology, 200)

            # The attacker rewrites every reply from now on.
            relay_a.shift_ns = relay_b.shift_ns = SHIFT_NS
            refused = 'hoptrace_agent_clock_replies_refused_total{reason="mac"}'
            wait_until(lambda: scrape(agent_a)[refused] >= 6, "host-a refusing two rounds' replies", 20)
            jumps_b = 'hoptrace_collector_node_clock_jumps_total{node="host-b"}'
            wait_until(lambda: scrape(collector).get(jumps_b, 0) >= 1, "host-b's jump flagged", 20)
            send(topology, 200)

            a = scrape(agent_a)
            assert a[refused] >= 6 and a["hoptrace_agent_clock_round_failures_total"] >= 2
            assert a['hoptrace_agent_clock_replies_refused_total{reason="nonce"}'] == 0
            metrics = scrape(collector)
            assert metrics.get('hoptrace_collector_node_clock_jumps_total{node="host-a"}') == 0
            assert metrics[jumps_b] == 1
            assert (
                abs(metrics['hoptrace_collector_node_clock_last_jump_ns{node="host-b"}'] + SHIFT_NS) < 100_000
            )
            now = wait_until(
                lambda: (c := clocks(cluster))["host-b"]["last_jump"] and c, "host-b's jump in the store", 10
            )
            # host-a: still within its bound of the truth (0); nothing flagged.
            assert now["host-a"]["measured"] and abs(now["host-a"]["offset_ns"]) <= now["host-a"]["bound_ns"]
            assert now["host-a"]["last_jump"] is None
            # host-b: moved by the forgery, and flagged with it.
            assert abs(now["host-b"]["offset_ns"] + SHIFT_NS) <= 100_000, now["host-b"]
            jump = now["host-b"]["last_jump"]
            assert abs(jump["jump_ns"] + SHIFT_NS) <= jump["allowed_ns"] and jump["allowed_ns"] < 1_000_000
            table = cluster.hoptrace("agents").stdout
            print(f"host-a {now['host-a']}\nhost-b {now['host-b']}\n{table}")
            # the note gives the jump in ms to two decimals (the forged 5 ms less the drift since the fit)
            shown = re.search(
                r"note: host-b clock jumped by (-\d\.\d\d)ms at .* cross-node segments at host-b", table
            )
            assert shown and abs(float(shown[1]) * 1e6 - jump["jump_ns"]) <= 5_000, table
            assert "host-a clock jumped" not in table

            report = json.loads(cluster.hoptrace("report", "clk-attack", "--since", "10m", "--json").stdout)
            (flagged,) = report["clock_jumps"]
            assert flagged["node"] == "host-b" and flagged["jump_ns"] == jump["jump_ns"]
            assert CROSS_HOST in flagged["segments"] and all(" > b-" in s for s in flagged["segments"])
            text = cluster.hoptrace("report", "clk-attack", "--since", "10m").stdout
            print(text)
            assert f"note: clock of host-b jumped by {jump['jump_ns'] / 1e6:.2f}ms" in text
            assert f"segments across it are suspect: {CROSS_HOST}" in text

            # One direction held 2 ms: authentic, so taken; the estimate moves by half of it, within a
            # bound that grew by as much. No jump: the bound says how little this round is worth.
            relay_a.shift_ns, relay_a.hold_requests_s = 0, HOLD_REQUESTS_S
            taken = rounds(agent_a)
            wait_until(lambda: rounds(agent_a) >= taken + 2, "host-a's rounds taken again", 20)
            held = wait_until(
                lambda: (c := clocks(cluster)["host-a"])["bound_ns"] >= 1_000_000 and c,
                "host-a's bound showing the held direction",
                10,
            )
            print(f"host-a, requests held {HOLD_REQUESTS_S * 1e3:.0f} ms: {held}")
            assert abs(held["offset_ns"]) <= held["bound_ns"], held
            assert -1_100_000 <= held["offset_ns"] <= -900_000, held  # half the 2 ms, node seemingly behind
            assert scrape(collector)['hoptrace_collector_node_clock_jumps_total{node="host-a"}'] == 0
            assert clocks(cluster)["host-a"]["last_jump"] is None
        finally:
            relay_a.close()
            relay_b.close()
