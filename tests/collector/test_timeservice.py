"""The collector's NTP time service and the reference Cristian client (clocksync.py)."""

from __future__ import annotations

import socket
import time

import ntplib
import pytest

from hoptrace.collector.clocksync import RESOLUTION_NS, measure_offset, node_clock
from hoptrace.collector.timeservice import TimeServer, ns_to_ntp, ntp_to_ns


@pytest.fixture
def time_server() -> TimeServer:
    server = TimeServer("127.0.0.1:0").start()
    yield server
    server.stop()


def test_reply_is_an_ntp_server_answer(time_server: TimeServer) -> None:
    request = ntplib.NTPPacket(version=4, mode=3, tx_timestamp=ns_to_ntp(time.time_ns()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        before = time.time_ns()
        s.sendto(request.to_data(), ("127.0.0.1", time_server.port))
        data = s.recv(512)
        after = time.time_ns()
    reply = ntplib.NTPPacket()
    reply.from_data(data)
    assert (reply.mode, reply.stratum, reply.version) == (4, 1, 4)
    assert abs(reply.orig_timestamp - request.tx_timestamp) < 1e-6  # the client's nonce echoed
    t2, t3 = ntp_to_ns(reply.recv_timestamp), ntp_to_ns(reply.tx_timestamp)
    # T2 <= T3, both within the exchange (1 us of slack for the float NTP timestamps)
    assert before - 1_000 <= t2 <= t3 + 1_000 and t3 <= after + 1_000
    assert time_server.kernel_timestamps  # T2 from SO_TIMESTAMPNS
    # ntplib's own client agrees: the offset of this machine against itself is ~0
    assert abs(ntplib.NTPClient().request("127.0.0.1", port=time_server.port).offset) < 1e-3


def test_offset_of_this_machine_is_zero_within_10us(time_server: TimeServer) -> None:
    addr = f"127.0.0.1:{time_server.port}"
    runs = [measure_offset(addr, probes=100) for _ in range(5)]
    for offset, delay, bound in runs:
        # one clock on both sides: the true offset is 0, so |offset| is the estimation error
        print(f"offset {offset} ns, delay {delay} ns, bound {bound} ns")
        # the 10 us target is reported by the benchmarks; here: the estimate stays within its own bound
        # Cristian's bound, plus the slack of the server's T3 correction: T3 is the clock read plus the
        # smallest recent TX lag, an estimate that a reply faster than that minimum beats by a little.
        assert bound == delay // 2 + RESOLUTION_NS
        assert abs(offset) <= bound + 1_000
    assert time_server.requests >= 450  # 5 x 100 probes; a probe may time out on a loaded machine
    clock = node_clock(addr, probes=20, drift_ppm=0.25)
    assert abs(clock.offset_ns) <= 10_000 and clock.bound_ns > 0 and clock.drift_ppm == 0.25
    mono_to_real = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert abs(clock.monotonic_to_realtime_ns - mono_to_real) < 1_000_000
    assert abs(clock.sampled_at_ns - time.time_ns()) < 5 * 1_000_000_000


def test_no_server_is_a_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never answers
        with pytest.raises(TimeoutError):
            measure_offset(f"127.0.0.1:{port}", probes=2, timeout_s=0.1)
