"""`hoptrace import`: recorded agent files through the collector's pipeline, as their live stream would go.

An agent with `--out FILE` (standalone, `hoptrace-agent run --plan`, or beside its collector stream) writes
what it would stream as JSON lines (docs/design.md, "Standalone agent"): a `trace` line naming the trace's
hops on its node, `clock` lines (the node's monotonic->realtime mapping and, with a time service, its Cristian
offset and bound) before the records they place, `record` lines with the record action's values (and the
names of the kernel functions they name), the addresses a hop saw and the capture action's bytes, and once a
second a heartbeat's `counters` (with the file's watermark) and `event` lines.

Each file is read twice. `AgentFile.batches` turns it into the collector's own `DecodedBatch`es, each with the
clock in force, exactly as a `RecordBatch` would decode (`records.decode_batch`). The first pass only checks:
every line, then the files together (`check_files`: one node per file, each trace's hops from every node,
files of one recording), so that a bad file fails naming its line before anything is written. The second pass
merges the files' batches in master-time order, the order a collector would have received them in, and hands
them to a `CollectorPipeline` with the InfluxDB exporter (`import_files`); the join waits for the slowest
node, as it does live. Windows carry the collector tag `import` (`IMPORT_INSTANCE`): importing the same files
again rewrites the same points instead of adding to them; a bucket a live collector filled from the same
records would count them twice.
"""

from __future__ import annotations

import calendar
import heapq
import ipaddress
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from hoptrace import kernel_abi
from hoptrace.collector.aggregate import AggregateConfig
from hoptrace.collector.catalog import MAX_HOPS, DropSite, TraceCatalog
from hoptrace.collector.clock import mapping_of
from hoptrace.collector.influx import InfluxConfig, InfluxExporter, ensure_database
from hoptrace.collector.join import JoinConfig
from hoptrace.collector.pipeline import CollectorPipeline
from hoptrace.collector.records import (
    CAPTURE_MAX,
    TS_NS,
    Capture,
    CapturedRecord,
    DecodedBatch,
    DescribedRecord,
    FiveTuple,
    Record,
    RecordedValues,
)
from hoptrace.common.entry import CliError
from hoptrace.spec.actions import FIELD_NUMBERS
from hoptrace.v1 import records_pb2

# The collector tag of imported windows (AggregateConfig.instance).
IMPORT_INSTANCE = "import"
# Records per batch handed to the pipeline: an agent's batches are at most this (stream.Reader).
BATCH_RECORDS = 1024
# The line types an agent writes; a line of another type (a newer agent's) is skipped.
LINE_TYPES = frozenset({"status", "trace", "clock", "record", "counters", "event"})
# Files of one recording: each file's records of a trace lie within this of the others' (ns).
OVERLAP_SLACK_NS = 10_000_000_000
# How the dispatcher names a drop hop (spec/drops.py, drops: true): its records are no hop of the path.
DROP_HOP_PREFIX = "drops@"


class AgentFileError(ValueError):
    """A file that cannot be imported, named with its line: `PATH:LINE: what is wrong`."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")
        self.path = str(path)
        self.line = line


@dataclass
class TraceInFile:
    """What one file holds of one trace."""

    generation: int = 0
    hops: dict[int, str] = field(default_factory=dict)  # hop index -> name (trace, status or record lines)
    described: bool = False  # by a trace line (with the node), not only learned from records
    drop_reasons: dict[int, str] = field(default_factory=dict)  # this node's kernel's, for its drop hops
    records: int = 0
    first_ns: int | None = None  # master time of its first and last record
    last_ns: int | None = None
    first_line: int = 0  # the line of its first record


@dataclass
class FileStats:
    """What the first pass found in a file."""

    node: str = ""
    node_line: int = 0
    traces: dict[str, TraceInFile] = field(default_factory=dict)
    records: int = 0
    clocks: int = 0
    without_clock: bool = False  # records before any clock line (an agent that wrote none)


def parse_time(text: str) -> int:
    """ns since the epoch of an RFC 3339 UTC time with up to 9 fractional digits (the agent's `at`)."""
    if not text.endswith("Z"):
        raise ValueError(f"time {text!r} is not UTC (…Z)")
    whole, _, fraction = text[:-1].partition(".")
    if not fraction.isdigit() and fraction:
        raise ValueError(f"time {text!r}")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000_000 + int((fraction or "0").ljust(9, "0")[:9])


def _timestamp(text: str) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(parse_time(text))
    return stamp


def _int(obj: dict[str, Any], key: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if type(value) is not int:
        raise ValueError(f"{key} is {'missing' if value is None else repr(value)}, not an integer")
    return value


def _field_number(name: str) -> int:
    """A recorded field by its spec name, or by number (a field the agent did not know)."""
    number = FIELD_NUMBERS.get(name)
    if number is None:
        if not name.isdigit():
            raise ValueError(f"unknown field {name!r}")
        number = int(name)
    return number


def record_of(obj: dict[str, Any]) -> Record:
    """The record tuple (`records.RECORD_FIELDS` order) of a record line; its trace slot is not written."""
    return (
        _int(obj, "ts_ns"),
        _int(obj, "packet_id"),
        _int(obj, "flow_hash", 0),
        _int(obj, "ifindex", 0),
        _int(obj, "wire_len", 0),
        _int(obj, "hop_index"),
        0,
        _int(obj, "cpu", 0),
        _int(obj, "flags", 0),
    )


def addresses_of(obj: dict[str, Any]) -> FiveTuple:
    """The 5-tuple of a record line's `addresses`, addresses written as `records.decode_addresses` does."""
    return FiveTuple(
        _int(obj, "proto"),
        str(ipaddress.ip_address(obj.get("src"))),
        _int(obj, "src_port"),
        str(ipaddress.ip_address(obj.get("dst"))),
        _int(obj, "dst_port"),
    )


def capture_of(obj: dict[str, Any]) -> Capture:
    """The `Capture` of a record line's `capture`: the packet's first bytes, in hex in the line."""
    data = obj.get("bytes")
    if not isinstance(data, str):
        raise ValueError(f"capture bytes {data!r}")
    try:
        raw = bytes.fromhex(data)
    except ValueError:
        raise ValueError(f"capture bytes {data[:16]!r}...: not hexadecimal") from None
    if len(raw) > CAPTURE_MAX:
        raise ValueError(f"capture of {len(raw)} bytes, at most {CAPTURE_MAX}")
    return Capture(_int(obj, "wire_len"), _int(obj, "link_type"), raw)


def functions_of(obj: dict[str, Any]) -> dict[int, str]:
    """A record line's `functions`: the kernel functions its values name, by ID."""
    if not isinstance(obj, dict):
        raise ValueError(f"functions {obj!r}")
    return {int(key): str(name) for key, name in obj.items()}


def clock_of(obj: dict[str, Any]) -> records_pb2.NodeClock:
    """The `NodeClock` of a clock line."""
    drift = obj.get("drift_ppm", 0.0)
    if not isinstance(drift, int | float):
        raise ValueError(f"drift_ppm is {drift!r}, not a number")
    return records_pb2.NodeClock(
        monotonic_to_realtime_ns=_int(obj, "monotonic_to_realtime_ns"),
        offset_ns=_int(obj, "offset_ns", 0),
        bound_ns=_int(obj, "bound_ns", 0),
        drift_ppm=float(drift),
        delay_ns=_int(obj, "delay_ns", 0),
        sampled_at_ns=_int(obj, "sampled_at_ns", 0),
    )


def bucket_of(le: int) -> int:
    """The log2 bucket whose upper bound is `le` (= 2^b - 1)."""
    return (le + 1).bit_length() - 1


def _buckets(lines: Iterable[dict[str, Any]]) -> list[int]:
    buckets: dict[int, int] = {}
    for bucket in lines:
        buckets[bucket_of(_int(bucket, "le"))] = _int(bucket, "count")
    return [buckets.get(b, 0) for b in range(max(buckets) + 1)] if buckets else []


def counters_of(obj: dict[str, Any]) -> records_pb2.HopCounters:
    """The `HopCounters` of a counters line: every counter by its name, the hop's count and histogram."""
    counters = records_pb2.HopCounters(
        hop_index=_int(obj, "hop_index"),
        hop=str(obj.get("hop", "")),
        values=[_int(obj, name, 0) for name in kernel_abi.COUNTERS],
        attached_ns=_int(obj, "attached_ns", 0),
    )
    if obj.get("at"):
        counters.at.CopyFrom(_timestamp(obj["at"]))
    count, histogram = obj.get("count"), obj.get("histogram")
    if count is not None or histogram is not None:
        actions = counters.actions
        if count is not None:
            actions.count = True
            actions.count_by = _field_number(count["by"]) if count.get("by") else 0
            for key, value in (count.get("keys") or {}).items():
                actions.counts[int(key)] = value
        if histogram is not None:
            actions.histogram = _field_number(histogram["field"])
            actions.buckets.extend(_buckets(histogram.get("buckets") or []))
    return counters


def event_of(obj: dict[str, Any]) -> records_pb2.EventValues:
    """The `EventValues` of an event line."""
    event = records_pb2.EventValues(
        event_index=_int(obj, "event_index"),
        event=str(obj.get("event", "")),
        count_by=str(obj.get("count_by", "")),
        count="counts" in obj,
        histogram=str(obj.get("histogram", "")),
        seen=_int(obj, "seen", 0),
        matched=_int(obj, "matched", 0),
        latency_missed=_int(obj, "latency_missed", 0),
    )
    if obj.get("at"):
        event.at.CopyFrom(_timestamp(obj["at"]))
    for key, value in (obj.get("counts") or {}).items():
        event.counts[int(key)] = value
    event.buckets.extend(_buckets(obj.get("buckets") or []))
    for r in obj.get("recorded") or []:
        event.recorded.add(
            arg=str(r.get("arg", "")),
            count=_int(r, "count", 0),
            sum=float(r.get("sum", 0)),
            min=_int(r, "min", 0),
            max=_int(r, "max", 0),
            last=_int(r, "last", 0),
            signed=bool(r.get("signed")),
        )
    return event


def _has_hop(group: _Group, obj: dict[str, Any]) -> bool:
    """Whether the group has counters of the line's hop already (then the line begins the next heartbeat)."""
    return any(c.hop_index == obj.get("hop_index") for c in group.counters)


@dataclass
class _Group:
    """Lines of one trace on their way into one DecodedBatch."""

    trace: str
    records: list[Record] = field(default_factory=list)
    values: list[RecordedValues] = field(default_factory=list)
    addresses: list[DescribedRecord] = field(default_factory=list)
    captures: list[CapturedRecord] = field(default_factory=list)
    functions: dict[int, str] = field(default_factory=dict)
    counters: list[records_pb2.HopCounters] = field(default_factory=list)
    events: list[records_pb2.EventValues] = field(default_factory=list)
    watermark_ns: int = 0
    agent_dropped: int = 0


class AgentFile:
    """One agent's JSON lines file: its node, and its lines as the collector's batches."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.stats = FileStats()
        # Records before any clock line (a file of an agent that wrote none) are placed with this host's
        # monotonic->realtime mapping: right when the file is imported where it was recorded, since boot.
        self.fallback_clock = records_pb2.NodeClock(
            monotonic_to_realtime_ns=time.time_ns() - time.monotonic_ns()
        )
        self._seq = 0
        self._read_node = ""  # the node of the whole file, once it was read through

    @property
    def node(self) -> str:
        """The node the file's trace and clock lines name; the file's name for a file without any."""
        return self._read_node or self.stats.node or self.path.name.split(".")[0]

    def _lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, object) of every line; AgentFileError on one that is no agent line."""
        with open(self.path, "rb") as file:
            lineno = 0
            known = False
            for lineno, raw in enumerate(file, 1):  # noqa: B007 - lineno is used after the loop
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as error:
                    if not known:
                        raise AgentFileError(
                            self.path, lineno, "not a hoptrace agent's JSON lines (hoptrace-agent --out FILE)"
                        ) from None
                    truncated = not raw.endswith(b"\n")
                    raise AgentFileError(
                        self.path,
                        lineno,
                        f"a truncated line (the agent stopped while writing it?): {error.msg}"
                        if truncated
                        else f"not JSON: {error.msg} at column {error.colno}",
                    ) from None
                kind = obj.get("type") if isinstance(obj, dict) else None
                if kind not in LINE_TYPES:
                    if not known:
                        raise AgentFileError(
                            self.path,
                            lineno,
                            "not a hoptrace agent's JSON lines (hoptrace-agent --out FILE): its first line's "
                            f"type is {kind!r}",
                        )
                    continue  # a line of a newer agent
                known = True
                yield lineno, obj
            if not known:
                raise AgentFileError(self.path, lineno, "no hoptrace agent's lines in it")

    def _node_line(self, lineno: int, node: object) -> None:
        if not isinstance(node, str) or not node:
            raise AgentFileError(self.path, lineno, f"node {node!r}")
        if self.stats.node and node != self.stats.node:
            raise AgentFileError(
                self.path,
                lineno,
                f"node {node}, but line {self.stats.node_line} is of node {self.stats.node}: "
                "one file per node, as the agent writes it",
            )
        if not self.stats.node:
            self.stats.node, self.stats.node_line = node, lineno

    def batches(self) -> Iterator[tuple[int, DecodedBatch]]:
        """The file's batches in file order, each with its master time (its first record's, a heartbeat's
        watermark): the collector's `DecodedBatch` of what the agent streamed. Fills `stats` on the way."""
        stats = self.stats = FileStats()
        clock: records_pb2.NodeClock | None = None
        mapping = mapping_of(self.fallback_clock)
        group: _Group | None = None
        last_key = 0
        for lineno, obj in self._lines():
            kind = obj["type"]
            try:
                trace = obj.get("trace")
                if kind in ("record", "counters", "event", "trace") and (
                    not isinstance(trace, str) or not trace
                ):
                    raise ValueError(f"trace {trace!r}")
                if group is not None and (
                    trace != group.trace
                    or kind not in ("record", "counters", "event")
                    or (kind == "record") != bool(group.records)
                    or (kind == "counters" and (group.events or _has_hop(group, obj)))
                    or len(group.records) >= BATCH_RECORDS
                ):
                    key, batch = self._batch(group, clock, mapping, last_key)
                    last_key = key
                    yield key, batch
                    group = None
                if kind == "record":
                    rec = record_of(obj)
                    if clock is None:
                        stats.without_clock = True
                    in_file = stats.traces.setdefault(trace, TraceInFile())
                    in_file.hops.setdefault(rec[5], str(obj.get("hop", "")))
                    master = mapping.to_master(rec[TS_NS])
                    if in_file.first_ns is None:
                        in_file.first_ns, in_file.first_line = master, lineno
                    in_file.last_ns = master
                    in_file.records += 1
                    stats.records += 1
                    group = group or _Group(trace)
                    group.records.append(rec)
                    if "values" in obj:
                        values = obj["values"]
                        if not isinstance(values, dict):
                            raise ValueError(f"values {values!r}")
                        group.values.append(
                            (rec, {_field_number(k): _int(values, k) for k in values if _field_number(k)})
                        )
                    if "functions" in obj:
                        group.functions.update(functions_of(obj["functions"]))
                    if "addresses" in obj:
                        group.addresses.append((rec, addresses_of(obj["addresses"])))
                    if "capture" in obj:
                        group.captures.append((rec, capture_of(obj["capture"])))
                elif kind in ("counters", "event"):
                    group = group or _Group(trace)
                    if kind == "counters":
                        group.counters.append(counters_of(obj))
                        group.watermark_ns = max(group.watermark_ns, _int(obj, "watermark_ns", 0))
                        group.agent_dropped = max(group.agent_dropped, _int(obj, "agent_dropped", 0))
                    else:
                        group.events.append(event_of(obj))
                elif kind == "clock":
                    self._node_line(lineno, obj.get("node"))
                    clock = clock_of(obj)
                    mapping = mapping_of(clock)
                    stats.clocks += 1
                elif kind == "trace":
                    self._node_line(lineno, obj.get("node"))
                    in_file = stats.traces.setdefault(trace, TraceInFile())
                    in_file.generation = _int(obj, "generation", 0)
                    in_file.described = True
                    reasons = obj.get("drop_reasons") or {}
                    in_file.drop_reasons = {int(value): str(name) for value, name in reasons.items()}
                    for hop in obj.get("hops") or []:
                        in_file.hops[_int(hop, "hop_index")] = str(hop.get("name", ""))
                elif kind == "status" and isinstance(obj.get("trace"), str):
                    # A standalone agent's status: its plan's hops, for a file without trace lines.
                    in_file = stats.traces.setdefault(obj["trace"], TraceInFile())
                    for hop in obj.get("hops") or []:
                        in_file.hops.setdefault(_int(hop, "hop_index", 0), str(hop.get("name", "")))
            except AgentFileError:
                raise
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                raise AgentFileError(self.path, lineno, f"{kind} line: {error}") from None
        if group is not None:
            yield self._batch(group, clock, mapping, last_key)
        self._read_node = self.node

    def _batch(
        self, group: _Group, clock: records_pb2.NodeClock | None, mapping: Any, last_key: int
    ) -> tuple[int, DecodedBatch]:
        self._seq += 1
        in_file = self.stats.traces.get(group.trace)
        batch = DecodedBatch(
            node=self.node,
            trace=group.trace,
            generation=in_file.generation if in_file else 0,
            batch_seq=self._seq,
            records=group.records,
            counters=group.counters,
            clock=clock if clock is not None else self.fallback_clock,
            agent_dropped=group.agent_dropped,
            watermark_ns=group.watermark_ns,
            events=group.events,
            values=group.values,
            addresses=group.addresses,
            captures=group.captures,
            functions=group.functions,
        )
        if group.records:
            key = mapping.to_master(group.records[0][TS_NS])
        elif group.watermark_ns:
            key = mapping.to_master(group.watermark_ns)
        else:
            key = last_key  # final counters: where the file is
        return key, batch


def scan_files(paths: Iterable[str | Path]) -> list[AgentFile]:
    """Read every file once, checking every line; AgentFileError names the first bad one."""
    files = [AgentFile(path) for path in paths]
    for agent_file in files:
        for _ in agent_file.batches():
            pass
    return files


@dataclass(frozen=True)
class ImportedPath:
    """A trace's path as the files give it: hop names and nodes by hop index, and its drop hops."""

    trace: str
    hop_names: tuple[str, ...]
    hop_nodes: tuple[str, ...]
    drop_hops: tuple[DropSite, ...] = ()


def _span(start: int | None, end: int | None) -> str:
    def utc(ns: int | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime((ns or 0) / 1e9))

    return f"{utc(start)}..{utc(end)[11:]} UTC"


def check_files(files: list[AgentFile]) -> list[ImportedPath]:
    """The traces' paths from every file's trace lines, once the files are known to fit together: each
    trace's hops from 0 on, each named once; several files share their traces, recorded together; a node's
    records of a trace in one file only. AgentFileError otherwise, naming the file."""
    traces: dict[str, dict[int, tuple[str, str, AgentFile]]] = {}
    for agent_file in files:
        for trace, in_file in agent_file.stats.traces.items():
            hops = traces.setdefault(trace, {})
            for index, name in sorted(in_file.hops.items()):
                if index >= MAX_HOPS:
                    raise AgentFileError(
                        agent_file.path, 0, f"trace {trace}: hop index {index} >= {MAX_HOPS}"
                    )
                known = hops.get(index)
                if known is None:
                    hops[index] = (name, agent_file.node, agent_file)
                elif (known[0], known[1]) != (name, agent_file.node):
                    raise AgentFileError(
                        agent_file.path,
                        0,
                        f"trace {trace}: hop {index} is {name} on {agent_file.node}, but {known[0]} on "
                        f"{known[1]} in {known[2].path}: files of different traces of one name?",
                    )
    if len(files) > 1:
        for agent_file in files:
            shared = [
                t
                for t in agent_file.stats.traces
                if any(t in f.stats.traces for f in files if f is not agent_file)
            ]
            if not shared:
                held = ", ".join(sorted(agent_file.stats.traces)) or "no trace"
                raise AgentFileError(
                    agent_file.path,
                    0,
                    f"holds {held}, which no other file of this import holds: the join needs the files "
                    "of one trace's nodes together (import a trace's files in one command, other traces "
                    "in another)",
                )
    paths = []
    for trace, hops in sorted(traces.items()):
        if not hops:
            continue  # named by a status line only, no hop attached: nothing to import
        missing = [i for i in range(max(hops) + 1) if i not in hops]
        if missing:
            held = "; ".join(
                f"{f.path}: hops {', '.join(str(i) for i in sorted(f.stats.traces[trace].hops))}"
                for f in files
                if trace in f.stats.traces
            )
            raise AgentFileError(
                hops[min(hops)][2].path,
                0,
                f"trace {trace}: hop {', '.join(map(str, missing))} is in none of the files ({held}): "
                "import every node's file of the trace",
            )
        names = [hops[i][0] or f"hop{i}" for i in range(len(hops))]
        if len(set(names)) != len(names):
            raise AgentFileError(hops[0][2].path, 0, f"trace {trace}: hop names repeat: {', '.join(names)}")
        path = [i for i in range(len(hops)) if not names[i].startswith(DROP_HOP_PREFIX)]
        if path != list(range(len(path))):
            raise AgentFileError(
                hops[0][2].path, 0, f"trace {trace}: drop hops among the path's: {', '.join(names)}"
            )
        drops = tuple(
            DropSite(i, hops[i][1], names[i], hops[i][2].stats.traces[trace].drop_reasons)
            for i in range(len(path), len(hops))
        )
        _check_recorded_together(trace, [f for f in files if trace in f.stats.traces])
        paths.append(ImportedPath(trace, tuple(names[: len(path)]), tuple(hops[i][1] for i in path), drops))
    return paths


def catalog_of(paths: Iterable[ImportedPath]) -> TraceCatalog:
    """The collector's catalog of the imported traces' paths."""
    catalog = TraceCatalog()
    for path in paths:
        catalog.set_trace(path.trace, path.hop_names, path.hop_nodes, drop_hops=path.drop_hops)
    return catalog


def _check_recorded_together(trace: str, files: list[AgentFile]) -> None:
    """Each file's records of `trace` overlap the others' (within OVERLAP_SLACK_NS); a node's are in one."""
    spans = [(f, f.stats.traces[trace]) for f in files if f.stats.traces[trace].records]
    unplaced = next((f for f, _ in spans if f.stats.without_clock), None)
    if unplaced is not None and len(spans) > 1:
        raise AgentFileError(
            unplaced.path,
            0,
            f"trace {trace}: its records have no clock line (an older agent's file), so they cannot be "
            "placed beside other nodes' records: import it alone",
        )
    for agent_file, in_file in reversed(spans):  # the later file named of two that do not fit
        others = [t for f, t in spans if f is not agent_file]
        assert in_file.first_ns is not None and in_file.last_ns is not None
        if others:
            start = min(t.first_ns or 0 for t in others) - OVERLAP_SLACK_NS
            end = max(t.last_ns or 0 for t in others) + OVERLAP_SLACK_NS
            if in_file.last_ns < start or in_file.first_ns > end:
                raise AgentFileError(
                    agent_file.path,
                    in_file.first_line,
                    f"trace {trace}: its records ({_span(in_file.first_ns, in_file.last_ns)}) are not "
                    f"from when the other files' were "
                    f"({_span(start + OVERLAP_SLACK_NS, end - OVERLAP_SLACK_NS)}): a file of another "
                    "recording of the trace?",
                )
        for other, theirs in spans:
            if other is agent_file or other.node != agent_file.node:
                continue
            assert theirs.first_ns is not None and theirs.last_ns is not None
            if theirs.first_ns <= in_file.last_ns and in_file.first_ns <= theirs.last_ns:
                raise AgentFileError(
                    other.path,
                    theirs.first_line,
                    f"trace {trace}: node {other.node}'s records of the same time as in {agent_file.path} "
                    "(the same file twice?)",
                )


def feed_pipeline(
    files: list[AgentFile], pipeline: CollectorPipeline, after_batch: Callable[[], None] | None = None
) -> None:
    """Hand the files' batches to `pipeline` in master-time order across files (each file's in its own
    order), as a collector receives the nodes' streams, then flush it. The pipeline's "now" is the time the
    batches have reached."""
    reached = [0]
    pipeline.now_ns = lambda: reached[0]
    for key, batch in heapq.merge(*(f.batches() for f in files), key=lambda item: item[0]):
        reached[0] = max(reached[0], key)
        pipeline.consume(batch)
        if after_batch is not None:
            after_batch()
    pipeline.flush()


@dataclass
class ImportSummary:
    """What an import did."""

    files: int = 0
    records: int = 0
    paths: list[ImportedPath] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)  # the pipeline's (CollectorPipeline.stats)
    points: int = 0  # written to InfluxDB
    warnings: list[str] = field(default_factory=list)


def import_files(
    paths: Iterable[str | Path],
    influx: InfluxConfig,
    join_window_ns: int = JoinConfig.window_ns,
    aggregate: AggregateConfig | None = None,
    create_database: bool = True,
    flush_timeout_s: float = 120.0,
) -> ImportSummary:
    """Check the files, then run their batches through a `CollectorPipeline` into InfluxDB (`influx`) in
    master-time order, flush, and wait for the writes. AgentFileError on a bad file (nothing written then);
    CliError when InfluxDB did not take every point."""
    files = scan_files(paths)
    imported = check_files(files)
    summary = ImportSummary(files=len(files), records=sum(f.stats.records for f in files), paths=imported)
    for agent_file in files:
        if not agent_file.stats.node:
            summary.warnings.append(
                f"{agent_file.path}: no trace or clock line names its node (an older agent's file): "
                f"taken as node {agent_file.node}, from the file's name"
            )
        if agent_file.stats.without_clock:
            summary.warnings.append(
                f"{agent_file.path}: records without a clock line (an older agent's file): placed with this "
                "host's monotonic clock, right only on the host that recorded them, since its boot"
            )
    catalog = catalog_of(imported)
    influx.validate()
    if create_database and not ensure_database(influx.url, influx.bucket, influx.token):
        raise CliError(
            f"InfluxDB at {influx.url} did not create the database of {influx.bucket}: is it running, is the "
            "token right? nothing was imported"
        )
    aggregate = aggregate or AggregateConfig(instance=IMPORT_INSTANCE)
    exporter = InfluxExporter(influx)
    try:
        pipeline = CollectorPipeline(exporter, catalog, JoinConfig(window_ns=join_window_ns), aggregate)

        def keep_up() -> None:  # the pipeline never waits for its exporter; an import can
            if exporter.pending > influx.max_pending // 2:
                exporter.flush(flush_timeout_s)

        feed_pipeline(files, pipeline, keep_up)
        written = exporter.flush(flush_timeout_s)
        summary.stats = pipeline.stats()
        summary.points = exporter.written
        if not written or exporter.dropped or exporter.spool_points:
            raise CliError(
                f"InfluxDB {influx.url} {influx.bucket} took {exporter.written} points; "
                f"{exporter.dropped} dropped, {exporter.spool_points} left unwritten"
            )
    finally:
        exporter.close()
    return summary
