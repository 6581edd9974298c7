"""The collector's NTP time service and the reference Cristian client (clocksync.py)."""

from __future__ import annotations

import socket
import time

import ntplib
import pytest

from hoptrace.collector.clocksync import RESOLUTION_NS, measure_offset, node_clock
from hoptrace.collector.timeservice import (
    TimeServer,
    ns_of_ntp_fixed,
    ns_to_ntp,
    ntp_fixed,
    ntp_to_ns,
    reply_times,
)


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
    # T2 and T3 exactly as written (32.32 fixed point), within the exchange; ntplib's floats agree to 1 us
    t2, t3 = reply_times(data)
    assert before <= t2 <= after and before <= t3 <= after + 1_000_000  # T3 includes the expected TX lag
    assert (
        abs(ntp_to_ns(reply.recv_timestamp) - t2) < 1_000 and abs(ntp_to_ns(reply.tx_timestamp) - t3) < 1_000
    )
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


def test_ntp_fixed_point_keeps_every_nanosecond() -> None:
    """T2 and T3 cross the wire as 32.32 fixed point: exact to the ns, where ntplib's floats lose 0.24 us."""
    assert ntp_fixed(0) == 2_208_988_800 << 32  # the Unix epoch in NTP era 0
    assert ntp_fixed(500_000_000) == (2_208_988_800 << 32) | (1 << 31)
    now = time.time_ns()
    for ns in (now, now + 1, now + 999_999_999, 2_085_978_496_000_000_123):  # the last one is in era 1 (2036)
        assert ns_of_ntp_fixed(ntp_fixed(ns)) == ns
    assert max(abs(ntp_to_ns(ns_to_ntp(now + k)) - (now + k)) for k in range(0, 1_000_000, 997)) > 100
