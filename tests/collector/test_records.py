"""records.py: the Python mirror of struct hoptrace_record, checked against the header and the BPF object."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess

import pytest
from collector_helpers import BPF_OBJ, ROOT, batch, pid, rec

from hoptrace.collector.records import (
    RECORD_FIELDS,
    RECORD_FORMAT,
    RECORD_SIZE,
    Counter,
    RecordDecodeError,
    RecordFlag,
    decode_batch,
    decode_records,
    origin_of,
    pack_records,
)

HEADER = ROOT / "kernel-patch" / "include" / "hoptrace.h"


def _btf_types() -> dict[int, dict]:
    if not BPF_OBJ.exists():
        pytest.fail(f"{BPF_OBJ} is missing: run make bpf")
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run(
        [bpftool, "btf", "dump", "file", str(BPF_OBJ), "-j"], check=True, capture_output=True
    )
    return {t["id"]: t for t in json.loads(out.stdout)["types"]}


def _type_size(types: dict[int, dict], type_id: int) -> int:
    t = types[type_id]
    while t["kind"] in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
        t = types[t["type_id"]]
    return t["size"]


def test_layout_matches_btf_of_the_bpf_object() -> None:
    types = _btf_types()
    structs = [t for t in types.values() if t["kind"] == "STRUCT" and t.get("name") == "hoptrace_record"]
    assert structs, f"struct hoptrace_record not in the BTF of {BPF_OBJ}"
    st = structs[0]
    assert st["size"] == RECORD_SIZE == struct.calcsize(RECORD_FORMAT) == 32
    assert [m["name"] for m in st["members"]] == list(RECORD_FIELDS)
    offset = 0
    for member, code in zip(st["members"], RECORD_FORMAT[1:], strict=True):
        size = struct.calcsize("<" + code)
        assert member["bits_offset"] == offset * 8, member["name"]
        assert _type_size(types, member["type_id"]) == size, member["name"]
        offset += size
    assert offset == st["size"]


def _header_enum(name: str) -> dict[str, int]:
    body = re.search(r"enum " + name + r" \{(.*?)\};", HEADER.read_text(), re.S)
    assert body, name
    values: dict[str, int] = {}
    nxt = 0
    for line in body.group(1).splitlines():
        m = re.match(r"\s*(HOPTRACE_\w+)\s*(?:=\s*([^,]+))?,", line)
        if not m:
            continue
        nxt = eval(m.group(2), {}) if m.group(2) else nxt  # noqa: S307 - "1 << 3" style constants of our header
        values[m.group(1)] = nxt
        nxt += 1
    return values


def test_flags_and_counters_match_the_header() -> None:
    flags = _header_enum("hoptrace_record_flag")
    assert {f"HOPTRACE_F_{f.name}": f.value for f in RecordFlag} == flags
    counters = _header_enum("hoptrace_counter")
    assert {f"HOPTRACE_C_{c.name}": c.value for c in Counter} == counters


def test_pack_decode_roundtrip() -> None:
    records = [rec(1_000 + i, pid(i + 1), i % 3, flags=int(RecordFlag.UDP)) for i in range(100)]
    data = pack_records(records)
    assert len(data) == 100 * 32
    assert list(decode_records(data)) == records
    assert origin_of(pid(5)) == 7


def test_larger_record_size_reads_the_known_prefix() -> None:
    records = [rec(10, pid(1), 0), rec(20, pid(2), 1)]
    data = b"".join(struct.pack(RECORD_FORMAT, *r) + b"\xff" * 8 for r in records)
    assert list(decode_records(data, 40)) == records


def test_malformed_records_are_refused() -> None:
    with pytest.raises(RecordDecodeError):
        list(decode_records(b"\0" * 33))
    with pytest.raises(RecordDecodeError):
        list(decode_records(b"\0" * 32, 16))


def test_decode_batch() -> None:
    msg = batch("n1", "t", [rec(5, pid(1), 0)], seq=3, clock_delta=100)
    b = decode_batch(msg)
    assert (b.node, b.trace, b.batch_seq, b.records) == ("n1", "t", 3, [rec(5, pid(1), 0)])
    assert b.clock is not None and b.clock.monotonic_to_realtime_ns == 100
    assert decode_batch(batch("n1", "t", [])).clock is None
