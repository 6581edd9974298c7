"""Authenticated clock rounds, the collector's side (clockauth.py, the time service, the reference client):
the bytes both languages agree on, the keys' rotation, and forged, replayed and outdated exchanges refused."""

from __future__ import annotations

import socket
import struct
import threading

import ntplib
import pytest

from hoptrace.collector.clockauth import (
    NTP_HEADER,
    ClockAuthError,
    ClockKeys,
    auth_request,
    check_reply,
    derive_key,
    read_key_file,
    sign_reply,
)
from hoptrace.collector.clocksync import ClientKey, measure_offset
from hoptrace.collector.timeservice import TimeServer, ntp_fixed, reply_times
from hoptrace.lab.waiting import wait_until

# agent/internal/clock/auth_test.go pins the same vector: master 0x42 * 32, node host-b, key_id 7, nonce
# 00..0f, T1 1800000000.123456789 s, T2 and T3 of the reply.
WIRE_KEY = "d152e8f1617b071f24a0deceeb49dd6101ffc02988223581826687b6b8e753c4"
WIRE_REQUEST = (
    "23000000000000000000000000000000000000000000000000000000000000000000000000000000eef450801f9add37"
    "4854433100000007000102030405060708090a0b0c0d0e0f06686f73742d62ef3f52b0e3197a104dc5132a2285a137"
)
WIRE_REPLY = (
    "240100000000000000000000000000000000000000000000eef450801f9add37eef450801f9db22deef450801f9e59f3"
    "4854433100000007000102030405060708090a0b0c0d0e0fa9e02f2ba37e3a9f8069178c55522237"
)


@pytest.mark.unit
def test_wire_format_is_the_agents() -> None:
    master, nonce = b"\x42" * 32, bytes(range(16))
    key = derive_key(master, "host-b", 7)
    assert key.hex() == WIRE_KEY
    header = bytes([0x23]) + bytes(39) + struct.pack("!Q", ntp_fixed(1_800_000_000_123_456_789))
    request = auth_request(header, key, 7, nonce, "host-b")
    assert request.hex() == WIRE_REQUEST
    keys = ClockKeys(master)
    keys.key_of = lambda node, key_id, now=None: derive_key(
        master, node, key_id
    )  # any key_id, for the vector
    assert keys.check_request(request) == ("host-b", 7, key, nonce)
    reply_header = (
        bytes([0x24, 1])
        + bytes(22)
        + struct.pack(
            "!QQQ",
            ntp_fixed(1_800_000_000_123_456_789),
            ntp_fixed(1_800_000_000_123_500_000),
            ntp_fixed(1_800_000_000_123_510_000),
        )
    )
    reply = sign_reply(reply_header, key, 7, nonce)
    assert reply.hex() == WIRE_REPLY
    check_reply(reply, key, 7, nonce)
    assert reply_times(reply) == (1_800_000_000_123_500_000, 1_800_000_000_123_510_000)
    # Any bit flipped is refused, and says why.
    for i in range(len(reply)):
        bad = bytearray(reply)
        bad[i] ^= 1
        with pytest.raises(ClockAuthError) as refused:
            check_reply(bytes(bad), key, 7, nonce)
        want = (
            "malformed" if i == 0 else "unauthenticated" if 48 <= i < 52 else "key" if 52 <= i < 56 else "mac"
        )
        assert refused.value.reason == want, i
    with pytest.raises(ClockAuthError, match="nonce"):
        check_reply(reply, key, 7, bytes(16))


@pytest.mark.unit
def test_keys_rotate_and_take_the_previous_one() -> None:
    keys = ClockKeys(rotate_s=10.0)
    start = keys._start
    assert keys.key_id(start) == 1 and keys.key_id(start + 9.9) == 1 and keys.key_id(start + 10) == 2
    issued = keys.issue("host-b", now=start + 4.0)
    assert (issued.node, issued.key_id, len(issued.key)) == ("host-b", 1, 32)
    assert issued.refresh_after.ToNanoseconds() == pytest.approx(6e9, abs=1e6)  # at the next rotation
    assert issued.valid_for.ToNanoseconds() == pytest.approx(16e9, abs=1e6)  # the end of the one after
    assert keys.key_of("host-b", 1, now=start + 15) == issued.key  # previous: still taken
    assert keys.key_of("host-b", 1, now=start + 20.5) is None  # two behind
    assert keys.key_of("host-b", 3, now=start + 15) is None  # not yet
    assert keys.key_of("host-b", 0, now=start + 1) is None  # a key file's id, this collector has none
    assert keys.key_of("host-a", 1, now=start + 1) != issued.key  # every node its own
    assert ClockKeys(rotate_s=10.0).issue("host-b").key != issued.key  # a restart: new secret
    fixed = ClockKeys(b"k" * 32)
    assert fixed.key_id(start + 1e6) == 0 and fixed.issue("n").key == derive_key(b"k" * 32, "n", 0)


@pytest.mark.unit
def test_key_file(tmp_path) -> None:
    raw = bytes(range(32))
    (tmp_path / "raw").write_bytes(raw)
    (tmp_path / "hex").write_text(raw.hex() + "\n")
    (tmp_path / "short").write_text("0123456789abcdef")
    assert read_key_file(str(tmp_path / "raw")) == raw == read_key_file(str(tmp_path / "hex"))
    with pytest.raises(ValueError, match="at least 32"):
        read_key_file(str(tmp_path / "short"))


@pytest.fixture
def keyed_server():
    keys = ClockKeys(rotate_s=3600.0)
    server = TimeServer("127.0.0.1:0", keys).start()
    yield server
    server.stop()


def test_authenticated_rounds_against_the_time_service(keyed_server: TimeServer) -> None:
    addr = f"127.0.0.1:{keyed_server.port}"
    issued = keyed_server.keys.issue("host-b")
    key = ClientKey("host-b", issued.key_id, issued.key)
    refused: dict[str, int] = {}
    offset, delay, bound = measure_offset(addr, probes=50, key=key, refused=refused)
    assert abs(offset) <= bound + 2_000 and refused == {}  # one clock both sides: 0 within the bound
    # (the server counts a reply once it is sent: the client may have it first)
    wait_until(lambda: keyed_server.requests == 50, "50 answers counted", 2, 0.01)
    assert keyed_server.authenticated == 50
    # A plain request still gets a plain answer (an agent that authenticates refuses those itself).
    measure_offset(addr, probes=5)
    wait_until(lambda: keyed_server.requests == 55, "55 answers counted", 2, 0.01)
    assert keyed_server.authenticated == 50
    # Another node's key, a made-up one, a key_id not taken: no answer at all, counted by the server.
    for wrong, reason in (
        (ClientKey("host-a", issued.key_id, issued.key), "mac"),
        (ClientKey("host-b", issued.key_id, bytes(32)), "mac"),
        (ClientKey("host-b", issued.key_id + 5, issued.key), "key"),
    ):
        with pytest.raises(TimeoutError):
            measure_offset(addr, probes=2, timeout_s=0.05, key=wrong)
        assert keyed_server.refused.get(reason, 0) >= 2
    assert keyed_server.requests == 55


def test_a_forged_reply_is_refused_by_the_reference_client(keyed_server: TimeServer) -> None:
    """A reply whose T2/T3 an on-path party moved by 5 ms, sent ahead of the real one: refused and counted,
    and the real answer is the one used."""
    issued = keyed_server.keys.issue("host-b")
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay.bind(("127.0.0.1", 0))
    relay.settimeout(0.5)
    upstream = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    upstream.settimeout(0.5)
    stop = threading.Event()

    def forward() -> None:
        while not stop.is_set():
            try:
                data, client = relay.recvfrom(512)
            except TimeoutError:
                continue
            upstream.sendto(data, ("127.0.0.1", keyed_server.port))
            reply = upstream.recv(512)
            forged = bytearray(reply)
            t2, t3 = reply_times(reply)
            struct.pack_into("!QQ", forged, 32, ntp_fixed(t2 + 5_000_000), ntp_fixed(t3 + 5_000_000))
            relay.sendto(bytes(forged), client)  # first the forgery,
            relay.sendto(reply[:NTP_HEADER], client)  # a plain copy,
            relay.sendto(reply, client)  # then the real one

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    try:
        refused: dict[str, int] = {}
        key = ClientKey("host-b", issued.key_id, issued.key)
        offset, _delay, bound = measure_offset(
            f"127.0.0.1:{relay.getsockname()[1]}", probes=20, key=key, refused=refused
        )
        assert refused == {"mac": 20, "unauthenticated": 20}
        assert abs(offset) <= bound + 2_000  # not the forgery's -5 ms
        # The same relay against a plain client: the first answer, the forgery, moves it by 5 ms.
        plain, _delay, plain_bound = measure_offset(f"127.0.0.1:{relay.getsockname()[1]}", probes=20)
        assert abs(plain + 5_000_000) <= plain_bound + 2_000
    finally:
        stop.set()
        thread.join()
        relay.close()
        upstream.close()


def test_ntplib_still_reads_a_plain_reply(keyed_server: TimeServer) -> None:
    assert abs(ntplib.NTPClient().request("127.0.0.1", port=keyed_server.port).offset) < 1e-3
