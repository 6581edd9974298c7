"""file_input.py: an agent's JSON lines give the pipeline what the live stream of the same batches gives it
(the record action's values and the functions they name, addresses, captured bytes), and a file that cannot
be imported is refused naming its line."""

from __future__ import annotations

import calendar
import heapq
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from collector_helpers import pid

from hoptrace.cli.main import main
from hoptrace.collector.catalog import DropSite, TraceCatalog
from hoptrace.collector.file_input import (
    AgentFileError,
    catalog_of,
    check_files,
    counters_of,
    event_of,
    feed_pipeline,
    parse_time,
    scan_files,
)
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.points import Point
from hoptrace.collector.records import (
    ADDRESSES_STRUCT,
    CAPTURE_STRUCT,
    F_ADDRESSES,
    F_CAPTURE,
    F_UDP,
    F_VALUES,
    RECORD_SIZE,
    VALUES_STRUCT,
    decode_batch,
    hop_counters,
    pack_records,
)
from hoptrace.collector.schema import (
    ADDRESS_TRANSLATIONS,
    HOP_ADDRESSES,
    HOP_CAPTURE,
    HOP_COUNTERS,
    HOP_RECORDED,
    SEGMENT_DROPS,
    SEGMENT_STATS,
)
from hoptrace.spec.actions import FIELD_NUMBERS
from hoptrace.v1 import records_pb2

pytestmark = pytest.mark.unit  # pure code: make test-unit runs it without root

TRACE = "imported"
# host-b's drop hop (drops: true) records the lost packets with their reason, after the path's hops.
HOPS = {"host-a": {0: "a-veth", 1: "a-wire"}, "host-b": {2: "b-wire", 3: "b-veth", 4: "drops@host-b"}}
HOP_AT_NS = (0, 2_000, 5_000, 7_000, 4_000)  # each hop's time after the packet's first, master clock
DROP_REASONS = {2: "NOT_SPECIFIED", 77: "NETFILTER_DROP"}  # host-b's kernel's enum skb_drop_reason
T0 = 1_800_000_000_000_000_000  # master time of the first packet
PACKETS, GAP_NS = 600, 5_000_000  # three seconds of packets
LOST_AT_B = {seq for seq in range(40, 600, 60)}  # ten packets lost before host-b's wire
# Each node's clock: monotonic->realtime mapping and its wall clock's offset from the master's.
CLOCKS = {
    "host-a": records_pb2.NodeClock(
        monotonic_to_realtime_ns=T0 - 50_000_000_000, offset_ns=-1_200, bound_ns=300
    ),
    "host-b": records_pb2.NodeClock(
        monotonic_to_realtime_ns=T0 - 900_000_000_000,
        offset_ns=3_700_000,
        bound_ns=450,
        drift_ppm=2.5,
        delay_ns=900,
        sampled_at_ns=T0 + 1_000_000_000,
    ),
}
LEN, DROP_REASON, DROP_FUNCTION = (
    FIELD_NUMBERS["len"],
    FIELD_NUMBERS["drop_reason"],
    FIELD_NUMBERS["drop_function"],
)
# The kernel function of host-b's drops, by the ID its agent writes in the value (above 2^63: exact in JSON)
NFT_DO_CHAIN = 0xC0FFEE0000000001
CAPTURING = {0: 1, 3: 101}  # hops with the capture action, and the link type of what they capture
FIELD_NAMES = {number: name for name, number in FIELD_NUMBERS.items()}
SERVICE = ("198.18.99.9", 8080)
BACKEND = ("198.18.2.2", 11111)


def mono(node: str, master_ns: int) -> int:
    """The node's CLOCK_MONOTONIC time of a master time (collector/clock.py, solved for ts)."""
    clock = CLOCKS[node]
    wall = master_ns + clock.offset_ns
    if clock.sampled_at_ns:  # offset(wall) = offset + drift * (wall - sampled_at); iterate once: ppm-small
        wall = master_ns + clock.offset_ns + round(clock.drift_ppm * 1e-6 * (wall - clock.sampled_at_ns))
    return wall - clock.monotonic_to_realtime_ns


def node_stream(node: str) -> list[records_pb2.RecordBatch]:
    """What the node's agent streams: batches of 50 records (values on a-wire and the drop hop, addresses on
    one packet in 64, captures on one packet in 3 at a-veth and b-veth) and a heartbeat each second of
    traffic."""
    hops = HOPS[node]
    records, values, addresses, captures = [], [], [], []
    for seq in range(PACKETS):
        packet = pid(seq)
        for hop in hops:
            if (hop == 4) != (seq in LOST_AT_B) and hop >= 2:
                continue  # lost before host-b's path hops; recorded at its drop hop
            flags = F_UDP
            if hop == 1:
                flags |= F_VALUES
                values.append(VALUES_STRUCT.pack(LEN, 0, 0, 0, 1, 100 + seq % 7, 0, 0, 0))
            if hop == 4:
                flags |= F_VALUES
                values.append(VALUES_STRUCT.pack(DROP_REASON, DROP_FUNCTION, 0, 0, 2, 77, NFT_DO_CHAIN, 0, 0))
            if hop in CAPTURING and seq % 3 == 0:
                flags |= F_CAPTURE
                data = f"packet {seq} at hop {hop}".encode()
                captures.append(CAPTURE_STRUCT.pack(90 + seq % 7, len(data), CAPTURING[hop], data))
            if seq % 64 == 1 and hop < 4:
                flags |= F_ADDRESSES
                dst = SERVICE if hop < 3 else BACKEND  # host-b's veth sees the backend: a DNAT before it
                addresses.append(
                    ADDRESSES_STRUCT.pack(
                        bytes([198, 18, 1, 2]).ljust(16, b"\0"),
                        bytes(map(int, dst[0].split("."))).ljust(16, b"\0"),
                        40000,
                        dst[1],
                        17,
                        4,
                    )
                )
            ts = mono(node, T0 + seq * GAP_NS + HOP_AT_NS[hop])
            records.append(((ts, packet, 0xABCD, 3 + hop, 100 + seq % 7, hop, 1, 0, flags), seq))
    out: list[records_pb2.RecordBatch] = []
    values_at = addresses_at = captures_at = 0
    for start in range(0, len(records), 50):
        chunk = [r for r, _ in records[start : start + 50]]
        msg = records_pb2.RecordBatch(
            node=node, trace=TRACE, generation=3, batch_seq=len(out) + 1, clock=CLOCKS[node]
        )
        msg.records = pack_records(chunk)
        msg.record_size = RECORD_SIZE
        with_values = sum(1 for r in chunk if r[8] & F_VALUES)
        with_addresses = sum(1 for r in chunk if r[8] & F_ADDRESSES)
        msg.values = b"".join(values[values_at : values_at + with_values])
        msg.value_size = VALUES_STRUCT.size
        msg.addresses = b"".join(addresses[addresses_at : addresses_at + with_addresses])
        msg.addresses_size = ADDRESSES_STRUCT.size
        with_captures = sum(1 for r in chunk if r[8] & F_CAPTURE)
        msg.captures = b"".join(captures[captures_at : captures_at + with_captures])
        msg.capture_size = CAPTURE_STRUCT.size
        if any(r[5] == 4 for r in chunk):
            msg.functions[NFT_DO_CHAIN] = "nft_do_chain"
        values_at += with_values
        addresses_at += with_addresses
        captures_at += with_captures
        out.append(msg)
        last_seq = records[min(start + 49, len(records) - 1)][1]
        if (last_seq + 1) % 200 == 0:  # a heartbeat each second: cumulative counters, the watermark
            out.append(heartbeat(node, last_seq, len(out) + 1))
    out.append(heartbeat(node, PACKETS - 1, len(out) + 1))
    return out


def heartbeat(node: str, seq: int, batch_seq: int) -> records_pb2.RecordBatch:
    """The node's counters after packet `seq`, at its wall clock, with its watermark."""
    master = T0 + seq * GAP_NS
    msg = records_pb2.RecordBatch(
        node=node,
        trace=TRACE,
        generation=3,
        batch_seq=batch_seq,
        clock=CLOCKS[node],
        watermark_ns=mono(node, master - 250_000_000),
        agent_dropped=2 if node == "host-b" else 0,
    )
    for hop, name in HOPS[node].items():
        lost = sum(1 for s in LOST_AT_B if s <= seq)
        seen = lost if hop == 4 else seq + 1 - (lost if hop >= 2 else 0)
        counters = hop_counters(hop, name, seen=seen, matched=seen, recorded=seen, bytes=seen * 100)
        counters.at.FromNanoseconds(master + CLOCKS[node].offset_ns)
        counters.attached_ns = mono(node, T0 - 1_000_000_000)
        msg.counters.append(counters)
    return msg


def agent_lines(node: str, stream: Iterable[records_pb2.RecordBatch]) -> str:
    """The node's stream as its agent writes it with --out (agent/internal/output): the trace line, a clock
    line, record lines with their trailers, counters lines of heartbeats."""
    hops = [{"hop_index": i, "name": n} for i, n in HOPS[node].items()]
    lines: list[dict] = [
        {"type": "status", "trace": TRACE, "generation": "3", "active": True, "hops": hops},
        {"type": "trace", "trace": TRACE, "generation": 3, "node": node, "hops": hops},
    ]
    if node == "host-b":
        lines[-1]["drop_reasons"] = {str(value): name for value, name in DROP_REASONS.items()}
    clock = CLOCKS[node]
    lines.append(
        {
            "type": "clock",
            "node": node,
            "monotonic_to_realtime_ns": clock.monotonic_to_realtime_ns,
            "offset_ns": clock.offset_ns,
            "bound_ns": clock.bound_ns,
            "drift_ppm": clock.drift_ppm,
            "delay_ns": clock.delay_ns,
            "sampled_at_ns": clock.sampled_at_ns,
        }
    )
    names = HOPS[node]
    for msg in stream:
        batch = decode_batch(msg)
        values = {r: v for r, v in batch.values}
        addresses = {r: a for r, a in batch.addresses}
        captured = {r: c for r, c in batch.captures}
        for r in batch.records:
            line = {
                "type": "record",
                "trace": TRACE,
                "hop": names[r[5]],
                "hop_index": r[5],
                "packet_id": r[1],
                "flow_hash": r[2],
                "ts_ns": r[0],
                "ifindex": r[3],
                "wire_len": r[4],
                "cpu": r[7],
                "flags": r[8],
            }
            if r in values:
                line["values"] = {FIELD_NAMES[number]: value for number, value in values[r].items()}
                named = values[r].get(DROP_FUNCTION)
                if named in batch.functions:
                    line["functions"] = {str(named): batch.functions[named]}
            if r in captured:
                c = captured[r]
                line["capture"] = {"wire_len": c.wire_len, "link_type": c.link_type, "bytes": c.data.hex()}
            if r in addresses:
                a = addresses[r]
                line["addresses"] = {
                    "proto": a.protocol,
                    "src": a.source,
                    "src_port": a.source_port,
                    "dst": a.destination,
                    "dst_port": a.destination_port,
                }
            lines.append(line)
        for c in msg.counters:
            line = {
                "type": "counters",
                "trace": TRACE,
                "generation": 3,
                "hop": c.hop,
                "hop_index": c.hop_index,
            }
            at = c.at.ToDatetime()
            line["at"] = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{c.at.nanos:09d}Z"
            line.update(dict(zip(("seen", "matched", "recorded"), c.values[:3], strict=True)))
            line["bytes"] = c.values[12]
            line.update(attached_ns=c.attached_ns, watermark_ns=msg.watermark_ns)
            if msg.agent_dropped:
                line["agent_dropped"] = msg.agent_dropped
            lines.append(line)
    return "".join(json.dumps(line) + "\n" for line in lines)


def catalog() -> TraceCatalog:
    cat = TraceCatalog()
    cat.set_trace(
        TRACE,
        ["a-veth", "a-wire", "b-wire", "b-veth"],
        ["host-a", "host-a", "host-b", "host-b"],
        drop_hops=[DropSite(4, "host-b", "drops@host-b", DROP_REASONS)],
    )
    return cat


def live_points() -> list[Point]:
    """What a collector makes of the two nodes' streams, each batch arriving when its first record (a
    heartbeat: its watermark) happened on the master's clock."""
    points: list[Point] = []
    pipeline = CollectorPipeline(type("List", (), {"export": staticmethod(points.extend)})(), catalog())
    streams = []
    for node in HOPS:
        clock, stream = CLOCKS[node], []
        for msg in node_stream(node):
            batch = decode_batch(msg)
            first = batch.records[0][0] if batch.records else batch.watermark_ns
            stream.append((first + clock.monotonic_to_realtime_ns - clock.offset_ns, batch))
        streams.append(stream)
    reached = [0]
    pipeline.now_ns = lambda: reached[0]
    for master, batch in heapq.merge(*streams, key=lambda m: m[0]):  # each node's stream in its order
        reached[0] = max(reached[0], master)
        pipeline.consume(batch)
    pipeline.flush()
    return points


def write_files(tmp_path: Path) -> list[Path]:
    paths = []
    for node in HOPS:
        path = tmp_path / f"{node}.jsonl"
        path.write_text(agent_lines(node, node_stream(node)))
        paths.append(path)
    return paths


def imported_points(paths: list[Path]) -> tuple[list[Point], CollectorPipeline]:
    files = scan_files(paths)
    points: list[Point] = []
    exporter = type("List", (), {"export": staticmethod(points.extend)})()
    pipeline = CollectorPipeline(exporter, catalog_of(check_files(files)))
    feed_pipeline(files, pipeline)
    return points, pipeline


def of(points: list[Point], measurement: str, with_time: bool = True) -> list[tuple]:
    return sorted(
        (p.tags, p.fields, p.time_ns if with_time else 0) for p in points if p.measurement == measurement
    )


def recorded(points: list[Point]) -> dict[tuple, tuple]:
    """hop_recorded by series: count, sum, min and max over its points."""
    out: dict[tuple, list] = {}
    for p in points:
        if p.measurement == HOP_RECORDED:
            f = dict(p.fields)
            seen = out.setdefault(p.tags, [0, 0.0, f["min"], f["max"]])
            seen[0] += f["count"]
            seen[1] += f["sum"]
            seen[2], seen[3] = min(seen[2], f["min"]), max(seen[3], f["max"])
    return {tags: tuple(v) for tags, v in out.items()}


def test_files_give_the_pipeline_what_the_stream_gives(tmp_path: Path) -> None:
    """The same batches, live and through files: the same windows to the ns and the byte, the same recorded
    values, counters, addresses and translations."""
    live = live_points()
    imported, pipeline = imported_points(write_files(tmp_path))
    stats = pipeline.stats()
    assert stats["packets"] == PACKETS and stats["complete"] == PACKETS - len(LOST_AT_B), stats
    windows = of(imported, SEGMENT_STATS)
    end_to_end = [w for w in windows if dict(w[0]).get("segment") == "end_to_end"]
    assert len(end_to_end) == 3, windows  # three seconds of packets
    assert sum(dict(w[1])["count"] for w in end_to_end) == PACKETS - len(LOST_AT_B)
    cross = [w for w in windows if dict(w[0]).get("segment") == "a-wire>b-wire"]
    assert sum(dict(w[1])["incomplete"] for w in cross) == len(LOST_AT_B), cross
    # host-b's clock mapped through its line: the cross-node segment is its 3 us, not its 3.7 ms offset.
    assert all(2_900 <= dict(w[1])["sum_ns"] / dict(w[1])["count"] <= 3_100 for w in cross), cross
    assert windows == of(live, SEGMENT_STATS)
    # (one point per batch: the file's batches are not the stream's, their sums are the same)
    assert recorded(imported) == recorded(live) != {}
    assert of(imported, HOP_COUNTERS) == of(live, HOP_COUNTERS) != []
    translations = of(imported, ADDRESS_TRANSLATIONS, with_time=False)
    assert translations == of(live, ADDRESS_TRANSLATIONS, with_time=False) != []
    assert of(imported, HOP_ADDRESSES, with_time=False) == of(live, HOP_ADDRESSES, with_time=False)
    assert sum(dict(t[1])["packets"] for t in translations) == len(range(1, PACKETS, 64))
    # What a collector stamps "now" lands among the records, not at the time of the import.
    assert all(T0 <= p.time_ns <= T0 + 4_000_000_000 for p in imported), {p.measurement for p in imported}
    assert pipeline.agent_dropped == {"host-b": 2}
    drops = of(imported, SEGMENT_DROPS)
    assert drops == of(live, SEGMENT_DROPS) != []
    assert {(dict(d[0])["reason"], dict(d[0])["function"]) for d in drops} == {
        ("NETFILTER_DROP", "nft_do_chain")
    }
    # Every capture, at its hop, to the ns and the byte.
    captured = of(imported, HOP_CAPTURE)
    assert captured == of(live, HOP_CAPTURE)
    assert len(captured) == len(range(0, PACKETS, 3)) + len(
        [s for s in range(0, PACKETS, 3) if s not in LOST_AT_B]
    )


def test_paths_and_nodes_come_from_the_trace_lines(tmp_path: Path) -> None:
    files = scan_files(write_files(tmp_path))
    assert [f.node for f in files] == ["host-a", "host-b"]
    (path,) = check_files(files)
    assert path.hop_names == ("a-veth", "a-wire", "b-wire", "b-veth")
    assert path.hop_nodes == ("host-a", "host-a", "host-b", "host-b")
    assert path.drop_hops == (DropSite(4, "host-b", "drops@host-b", DROP_REASONS),)
    assert files[1].stats.traces[TRACE].records == 2 * PACKETS - len(LOST_AT_B)


def test_parse_time_keeps_nanoseconds() -> None:
    assert parse_time("2027-01-15T08:00:00.000000001Z") == calendar.timegm((2027, 1, 15, 8, 0, 0)) * 10**9 + 1
    assert parse_time("1970-01-01T00:00:01.5Z") == 1_500_000_000
    assert parse_time("1970-01-01T00:00:02Z") == 2_000_000_000
    with pytest.raises(ValueError):
        parse_time("1970-01-01T00:00:02+01:00")


def error_of(*paths: Path) -> str:
    with pytest.raises(AgentFileError) as caught:
        check_files(scan_files(paths))
    return str(caught.value)


def test_bad_files_are_refused_naming_file_and_line(tmp_path: Path) -> None:
    a, b = write_files(tmp_path)
    text = b.read_text()
    lines = text.splitlines(keepends=True)

    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    assert error_of(a, other) == f"{other}:1: not a hoptrace agent's JSON lines (hoptrace-agent --out FILE)"

    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"type": "metrics", "x": 1}\n')
    assert error_of(foreign).startswith(f"{foreign}:1: not a hoptrace agent's JSON lines")

    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text(text[: len(text) - len(lines[-1]) // 2])
    assert error_of(a, truncated).startswith(f"{truncated}:{len(lines)}: a truncated line")

    broken = tmp_path / "broken.jsonl"
    at = next(i for i, line in enumerate(lines) if '"type": "record"' in line)
    broken.write_text("".join(lines[:at] + [lines[at].replace('"ts_ns": ', '"ts_ns": "x')] + lines[at + 1 :]))
    message = error_of(a, broken)
    assert message.startswith(f"{broken}:{at + 1}: ") and "not JSON" in message

    capture = next(i for i, line in enumerate(lines) if '"capture": ' in line)
    unhex = tmp_path / "unhex.jsonl"
    unhex.write_text(
        "".join(
            lines[:capture] + [lines[capture].replace('"bytes": "', '"bytes": "zz')] + lines[capture + 1 :]
        )
    )
    message = error_of(a, unhex)
    assert message.startswith(f"{unhex}:{capture + 1}: record line: capture bytes 'zz"), message
    assert message.endswith("...: not hexadecimal"), message

    typed = tmp_path / "typed.jsonl"
    typed.write_text(
        "".join(lines[:at] + [lines[at].replace('"ts_ns": ', '"ts_ns": 1.5, "x": ')] + lines[at + 1 :])
    )
    assert error_of(a, typed) == f"{typed}:{at + 1}: record line: ts_ns is 1.5, not an integer"

    two_nodes = tmp_path / "two-nodes.jsonl"
    two_nodes.write_text(text + a.read_text().splitlines(keepends=True)[1])
    assert error_of(two_nodes).startswith(
        f"{two_nodes}:{len(lines) + 1}: node host-a, but line 2 is of node host-b"
    )


def test_files_that_do_not_belong_together_are_refused(tmp_path: Path) -> None:
    a, b = write_files(tmp_path)
    # host-a's file of a trace of another name: the two share nothing.
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(a.read_text().replace(f'"trace": "{TRACE}"', '"trace": "other"'))
    message = error_of(renamed, b)
    assert message.startswith(f"{renamed}: holds other, which no other file of this import holds"), message
    # host-b's file alone: hops 0 and 1 are in none.
    assert error_of(b).startswith(f"{b}: trace {TRACE}: hop 0, 1 is in none of the files")
    # host-b's file of a recording an hour later.
    later = tmp_path / "later.jsonl"
    hour = 3_600_000_000_000
    later.write_text(
        b.read_text().replace(
            f'"monotonic_to_realtime_ns": {CLOCKS["host-b"].monotonic_to_realtime_ns}',
            f'"monotonic_to_realtime_ns": {CLOCKS["host-b"].monotonic_to_realtime_ns + hour}',
        )
    )
    message = error_of(a, later)
    first_record = next(i for i, line in enumerate(b.read_text().splitlines()) if '"record"' in line) + 1
    assert (
        message.startswith(f"{later}:{first_record}: trace {TRACE}: its records (")
        and "another recording" in message
    )
    # The same node's file twice.
    copy = tmp_path / "copy.jsonl"
    copy.write_text(b.read_text())
    assert "the same file twice?" in error_of(a, b, copy)
    # A hop of the same index with another name: another trace of the same name.
    clash = tmp_path / "clash.jsonl"
    clash.write_text(
        b.read_text().replace('"b-wire"', '"a-wire"').replace('"hop_index": 2', '"hop_index": 1')
    )
    assert "hop 1 is a-wire on host-b, but a-wire on host-a" in error_of(a, clash)


def test_a_file_of_an_older_agent_imports_alone(tmp_path: Path) -> None:
    """Without trace and clock lines (an agent before them): hops from its status line, the node from the
    file's name, times with this host's clock; beside another node's file it is refused, not misplaced."""
    paths = []
    for node in HOPS:
        old = [
            line
            for line in agent_lines(node, node_stream(node)).splitlines(keepends=True)
            if '"type": "trace"' not in line and '"type": "clock"' not in line
        ]
        path = tmp_path / f"{node}.jsonl"
        path.write_text("".join(old))
        paths.append(path)
    files = scan_files(paths[:1])
    assert files[0].node == "host-a" and files[0].stats.without_clock
    (path,) = check_files(files)
    assert path.hop_names == ("a-veth", "a-wire") and path.hop_nodes == ("host-a", "host-a")
    points: list[Point] = []
    exporter = type("List", (), {"export": staticmethod(points.extend)})()
    pipeline = CollectorPipeline(exporter, catalog_of([path]))
    feed_pipeline(files, pipeline)
    assert pipeline.stats()["complete"] == PACKETS
    assert sum(dict(p.fields)["count"] for p in points if p.measurement == SEGMENT_STATS) == 2 * PACKETS
    assert "no clock line" in error_of(*paths)


def test_hoptrace_import_says_what_is_wrong_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The command's bad input: exit 1, `error: FILE:LINE: ...`, no traceback; nothing reaches InfluxDB (a
    port nothing listens on)."""
    a, b = write_files(tmp_path)
    truncated = tmp_path / "host-b-cut.jsonl"
    text = b.read_text()
    truncated.write_text(text[:-20])
    lines = text.count("\n")
    assert main(["import", str(a), str(truncated), "--influx-url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {truncated}:{lines}: a truncated line") and err.count("\n") == 1, err
    assert main(["import", str(a), str(b), "--influx-url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: InfluxDB at http://127.0.0.1:9 did not create the database")
        and "Traceback" not in err
    )


def test_counters_and_event_lines_are_the_messages_the_agent_had() -> None:
    """A hop's count and histogram and an event's values, as agent/internal/output writes them, back as the
    HopCounters and EventValues of the heartbeat (buckets by their upper bound 2^b - 1)."""
    counters = counters_of(
        {
            "type": "counters",
            "trace": TRACE,
            "hop": "a-wire",
            "hop_index": 1,
            "at": "2027-01-15T08:00:00.000000123Z",
            "attached_ns": 55,
            "seen": 9,
            "bytes": 900,
            "count": {"by": "cpu", "keys": {"0": 7, "1": 2}},
            "histogram": {"field": "len", "buckets": [{"le": 127, "count": 9}]},
        }
    )
    expected = hop_counters(1, "a-wire", seen=9, bytes=900)
    expected.at.FromNanoseconds(calendar.timegm((2027, 1, 15, 8, 0, 0)) * 10**9 + 123)
    expected.attached_ns = 55
    expected.actions.count, expected.actions.count_by = True, FIELD_NUMBERS["cpu"]
    expected.actions.counts.update({0: 7, 1: 2})
    expected.actions.histogram = LEN
    expected.actions.buckets.extend([0] * 7 + [9])
    assert counters == expected
    event = event_of(
        {
            "type": "event",
            "trace": TRACE,
            "at": "1970-01-01T00:00:01Z",
            "event": "frames",
            "event_index": 1,
            "seen": 900,
            "matched": 151,
            "count_by": "cpu",
            "counts": {"0": 100, "1": 51},
            "histogram": "len",
            "buckets": [{"le": 2047, "count": 150}, {"le": 2**64 - 1, "count": 1}],
            "recorded": [
                {"arg": "len", "count": 3, "sum": 9.0, "min": 1, "max": 5, "last": 3, "signed": False}
            ],
        }
    )
    assert event.at.ToNanoseconds() == 1_000_000_000 and event.count and dict(event.counts) == {0: 100, 1: 51}
    assert list(event.buckets) == [0] * 11 + [150] + [0] * 52 + [1]
    assert (event.recorded[0].arg, event.recorded[0].count, event.recorded[0].max) == ("len", 3, 5)
