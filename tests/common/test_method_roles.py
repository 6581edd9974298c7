"""Every call of the user API has one least role, said once in code (METHOD_ROLES) and shown in
docs/security.md; the web's own token (operator) can make every call its pages make, Discover included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hoptrace.common.certs import DEFAULT_TOKENS
from hoptrace.common.grpcutil import METHOD_ROLES, ROLES
from hoptrace.v1 import api_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

ROOT = Path(__file__).resolve().parents[2]


def documented_roles() -> dict[str, str]:
    """The `| call | least role |` table of docs/security.md, one entry per call named in a row."""
    text = (ROOT / "docs" / "security.md").read_text()
    found: dict[str, str] = {}
    for calls, role in re.findall(r"^\s*\| ((?:`\w+`(?:, )?)+) \| (\w+) \|", text, re.MULTILINE):
        for call in re.findall(r"`(\w+)`", calls):
            found[call] = role
    return found


def test_every_api_call_has_a_role_in_code_and_docs() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["Hoptrace"]
    calls = {method.name for method in service.methods}
    assert set(METHOD_ROLES) == calls, "each call of service Hoptrace needs its least role in METHOD_ROLES"
    assert set(METHOD_ROLES.values()) <= set(ROLES)
    assert documented_roles() == METHOD_ROLES


def test_the_web_token_can_discover() -> None:
    """The web's new-trace page runs Discover with the demo's own web token."""
    web_role = ROLES.index(DEFAULT_TOKENS["web"])
    for call in ("Discover", "ApplyTrace", "DeleteTrace", "RunPreset", "GetReport", "GetPackets"):
        assert ROLES.index(METHOD_ROLES[call]) <= web_role, call
