"""records.py: the Python mirror of struct hoptrace_record, checked against the header and the BPF object."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess

import pytest
from collector_helpers import BPF_OBJ, batch, pid, rec

from hoptrace import kernel_abi
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

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root


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


def _btf_enum(types: dict[int, dict], name: str) -> dict[str, int]:
    enums = [t for t in types.values() if t["kind"] == "ENUM" and t.get("name") == name]
    assert enums, f"enum {name} not in the BTF of {BPF_OBJ} (its anchor in hoptrace.bpf.c is missing)"
    return {v["name"]: v["val"] for v in enums[0]["values"]}


def test_flags_counters_and_wire_constants_match_btf() -> None:
    """hoptrace.kernel_abi is generated from this BTF (make vocab); a stale copy fails here too."""
    types = _btf_types()
    flags = _btf_enum(types, "hoptrace_record_flag")
    assert {f"HOPTRACE_F_{f.name}": f.value for f in RecordFlag} == flags
    counters = _btf_enum(types, "hoptrace_counter")
    assert {f"HOPTRACE_C_{c.name}": c.value for c in Counter} == {
        name: value for name, value in counters.items() if name != "HOPTRACE_C_MAX"
    }
    assert counters["HOPTRACE_C_MAX"] == len(kernel_abi.COUNTERS)
    wire = _btf_enum(types, "hoptrace_wire")
    assert {
        f"HOPTRACE_{name}": getattr(kernel_abi, name) for name in (n[len("HOPTRACE_") :] for n in wire)
    } == wire


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
