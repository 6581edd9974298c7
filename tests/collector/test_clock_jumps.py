"""Clock jumps (collector/clock.py): a node's offset that moves beyond its bounds between two estimates,
unexplained by a step of its own clock, is flagged once, at once, with what it moved by; honest clocks
(drifting, simulated, stepped, rebooted) never are."""

from __future__ import annotations

import random

import pytest

from hoptrace.collector.clock import JUMP_SLACK_NS, ClockAligner
from hoptrace.collector.influx import line
from hoptrace.collector.points import node_clock_point
from hoptrace.v1 import records_pb2

pytestmark = pytest.mark.unit

SEC = 1_000_000_000
START = 1_800_000_000 * SEC  # node wall clock of the first round
M2R = START - 5_000 * SEC  # wall - monotonic: booted 5000 s before


def rounds(
    aligner: ClockAligner,
    node: str,
    offsets: list[int],
    *,
    every_s: int = 10,
    drift_ppm: float = 0.0,
    m2r_ppm: float = 0.0,
    bound: int = 5_000,
    steps: dict[int, int] | None = None,
    seed: int = 1,
) -> list[int]:
    """Feed one estimate per round (its NodeClock sent twice, as batches come), the offsets given plus up
    to a bound of noise; the wall clock steps by steps[i] before round i; the simulated agent's mapping
    drifts by m2r_ppm (--clock-drift-ppm drifts the wall clock alone). Returns the rounds that jumped."""
    rng = random.Random(seed)
    jumped, m2r, step_total = [], M2R, 0
    for i, offset in enumerate(offsets):
        step_total += (steps or {}).get(i, 0)
        at = START + i * every_s * SEC + step_total
        m2r_now = M2R + step_total + round(m2r_ppm * 1e-6 * i * every_s * SEC)
        clock = records_pb2.NodeClock(
            monotonic_to_realtime_ns=m2r_now,
            offset_ns=offset + step_total + rng.randint(-bound // 2, bound // 2),
            bound_ns=bound,
            delay_ns=2 * bound,
            drift_ppm=drift_ppm if i >= 2 else 0.0,  # the agent's fit needs rounds first
            sampled_at_ns=at,
        )
        before = aligner.jump_counts.get(node, 0)
        aligner.update(node, clock)
        clock.monotonic_to_realtime_ns = m2r  # a later batch: the same estimate again
        m2r = m2r_now
        aligner.update(node, clock)
        if aligner.jump_counts.get(node, 0) != before:
            jumped.append(i)
    return jumped


def drifting(n: int, ppm: float, every_s: int = 10, base: int = 3_700_000) -> list[int]:
    return [base + round(ppm * 1e-6 * i * every_s * SEC) for i in range(n)]


def test_honest_clocks_never_jump() -> None:
    c = ClockAligner()
    assert rounds(c, "steady", drifting(20, 0.0)) == []
    assert rounds(c, "drifting", drifting(20, 50.0), drift_ppm=50.0) == []
    # --clock-drift-ppm 50: the simulated wall clock drifts in the mapping too
    assert rounds(c, "simulated", drifting(20, 50.0), drift_ppm=50.0, m2r_ppm=50.0) == []
    # warm-up rounds 1 s apart before any drift is known: 80 ppm is within the allowance
    assert rounds(c, "warmup", drifting(3, 80.0, every_s=1), every_s=1) == []
    # settimeofday 2 s ahead, and back 30 ms later on: the offset moves with the mapping
    assert rounds(c, "stepped", drifting(10, 20.0), drift_ppm=20.0, steps={4: 2 * SEC, 7: -30_000_000}) == []
    assert c.jump_counts == {} and c.last_jump == {}


def test_a_shifted_exchange_is_a_jump_once() -> None:
    c = ClockAligner()
    offsets = drifting(10, 20.0)
    for i in range(5, 10):  # from round 5 on the exchange is rewritten: the master looks 5 ms later
        offsets[i] -= 5_000_000
    assert rounds(c, "host-b", offsets, drift_ppm=20.0, bound=8_000) == [5]
    assert c.jump_counts == {"host-b": 1}
    points = c.due_points(100 * SEC)
    (point,) = points
    assert point.jump is not None and point.jump.node == "host-b" and point.jump.ts_ns == 100 * SEC
    assert abs(point.jump.jump_ns + 5_000_000) <= 8_000 + 1_000  # -5 ms within the noise of two bounds
    assert point.jump.allowed_ns == 8_000 + 8_000 + JUMP_SLACK_NS
    assert c.last_jump["host-b"] == point.jump
    # the next estimate within the rate limit is not news; a jump is, at once
    rounds(c, "host-b", [offsets[-1] - 1_000_000 + i for i in range(2)], drift_ppm=20.0, bound=8_000)
    (again,) = c.due_points(100 * SEC + 1)
    assert again.jump is not None and c.jump_counts == {"host-b": 2}
    assert c.due_points(100 * SEC + 2) == []


def test_a_changed_rate_beyond_the_bounds_is_a_jump() -> None:
    c = ClockAligner()
    # fitted at 10 ppm, then running at 400 ppm: 3.9 ms off the prediction after 10 s
    offsets = drifting(5, 10.0) + [drifting(5, 10.0)[-1] + round(400e-6 * 10 * SEC)]
    assert rounds(c, "host-c", offsets, drift_ppm=10.0) == [5]


def test_a_reboot_is_not_a_jump() -> None:
    c = ClockAligner()
    rounds(c, "host-d", drifting(3, 0.0))
    reboot = (
        records_pb2.NodeClock(  # monotonic starts again: the mapping moves by the uptime, the offset stays
            monotonic_to_realtime_ns=START + 40 * SEC,
            offset_ns=3_700_000,
            bound_ns=5_000,
            sampled_at_ns=START + 40 * SEC,
        )
    )
    c.update("host-d", reboot)
    assert c.jump_counts == {}


def test_the_point_carries_the_jump() -> None:
    c = ClockAligner()
    rounds(c, "n 1", [0, 0, 0, 9_000_000])
    (point,) = c.due_points(5)
    assert line(node_clock_point(point)) == (
        rf"node_clock,node=n\ 1 offset_ns={point.offset_ns}i,delay_ns=10000i,bound_ns=5000i,drift_ppm=0.0,"
        f"jump_ns={point.jump.jump_ns}i,jump_allowed_ns={point.jump.allowed_ns}i 5"
    )


def test_one_direction_held_is_within_the_bound() -> None:
    """An on-path delay of the requests only (2 ms) moves the estimate by half of it, but its bound grows by
    as much (Cristian's bound holds whatever the split): no jump, and the truth stays inside the bound."""
    c = ClockAligner()
    base = [0, 0, 0]
    rounds(c, "host-a", base, bound=5_000)
    held = records_pb2.NodeClock(
        monotonic_to_realtime_ns=M2R,
        offset_ns=-1_000_000,  # ((T1 - T2) + (T4 - T3)) / 2 with T2 late by 2 ms
        bound_ns=1_000_000 + 5_000,  # delay / 2: the held 2 ms are in the round trip
        sampled_at_ns=START + 40 * SEC,
    )
    c.update("host-a", held)
    assert c.jump_counts == {} and abs(held.offset_ns - 0) <= held.bound_ns
