"""HOPTRACE_TIMEOUT_SCALE: one factor for every deadline on a slow machine (hoptrace.common.timeouts)."""

from __future__ import annotations

import pytest

from hoptrace.common.timeouts import scaled, timeout_scale

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


@pytest.mark.parametrize(
    ("setting", "factor"),
    [(None, 1.0), ("10", 10.0), ("2.5", 2.5), ("0.1", 1.0), ("-3", 1.0), ("fast", 1.0), ("", 1.0)],
)
def test_scale_is_a_factor_of_at_least_one(monkeypatch, setting, factor):
    if setting is None:
        monkeypatch.delenv("HOPTRACE_TIMEOUT_SCALE", raising=False)
    else:
        monkeypatch.setenv("HOPTRACE_TIMEOUT_SCALE", setting)
    assert timeout_scale() == factor
    assert scaled(5.0) == 5.0 * factor


def test_the_dispatchers_ack_deadline_follows_the_scale(monkeypatch):
    """A dispatcher started under the scale waits that much longer for each agent's status on apply."""
    from hoptrace.cli.main import build_parser

    monkeypatch.setenv("HOPTRACE_TIMEOUT_SCALE", "8")
    args = build_parser().parse_args(["dispatcher", "--insecure"])
    assert args.ack_timeout == 8 * 15.0
